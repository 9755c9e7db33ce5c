# Sourced by run_ssu_session.sh and run_ssd_session.sh (after they set OUT): the machine's setup, and the helpers
# every stage uses. Not a script of its own.
mkdir -p "$OUT"
t0=$(date +%s)  # before the setup: $BUDGET counts the whole run
if [ -f .gpu/setup.sh ]; then
    # the project's lab machine: TileLang and the peers from bundles, packages/*/src on PYTHONPATH (sourced in
    # this shell, not in a pipeline: its exports must stay). Elsewhere the packages are installed already.
    # shellcheck disable=SC1091
    source .gpu/setup.sh --peers >"$OUT/setup.log" 2>&1
    cat "$OUT/setup.log"
fi
export TILELANG_CACHE_DIR="${TILELANG_CACHE_DIR:-$HOME/.tilelang/cache}"
JOBS="${JOBS:-$(nproc)}"
T=packages/mate-runtime/tests/gpu  # the GPU tests
G=tools/gpu                        # these scripts and their helpers
# one timestamped line on stdout and in $OUT/session.log
stamp() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$OUT/session.log"; }
# seconds left of $BUDGET (default 570) since the session started: what a benchmark stage may still use
budget_left() { echo $((${BUDGET:-570} - ($(date +%s) - t0))); }
# a stage's time limit: its own ($1 s) or what is left of $BUDGET, whichever is smaller
stage_limit() { local left; left=$(budget_left); echo $(($1 < left ? $1 : (left > 1 ? left : 1))); }
# run pytest on the gpu-marked tests: name, time limit, test paths and pytest arguments...
gpu_pytest() {
    local name=$1 limit=$2
    shift 2
    timeout "$(stage_limit "$limit")" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider "$@" \
        --junitxml="$OUT/$name.xml" >"$OUT/$name.log" 2>&1
    stamp "$name rc=$? $(tail -1 "$OUT/$name.log")"
}
