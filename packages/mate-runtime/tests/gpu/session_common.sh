# Sourced by run_ssu_session.sh and run_ssd_session.sh (after they set OUT): the GPU machine's setup, and the
# helpers every stage uses. Not a script of its own.
mkdir -p "$OUT"
t0=$(date +%s)  # before the setup: $BUDGET counts the whole device command
if [ -f .gpu/setup.sh ]; then
    # sourced in this shell (not in a pipeline: its exports must stay)
    # shellcheck disable=SC1091
    source .gpu/setup.sh --peers >"$OUT/setup.log" 2>&1
    cat "$OUT/setup.log"
fi
export TILELANG_CACHE_DIR="${TILELANG_CACHE_DIR:-$HOME/.tilelang/cache}"
JOBS="${JOBS:-$(nproc)}"
# one timestamped line on stdout and in $OUT/session.log
stamp() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$OUT/session.log"; }
# seconds left of $BUDGET (default 570) since the session started: what a benchmark stage may still use
budget_left() { echo $((${BUDGET:-570} - ($(date +%s) - t0))); }
# a stage's time limit: its own ($1 s) or what is left of $BUDGET, whichever is smaller (so the results are
# packed before the device command's 600 s limit)
stage_limit() { local left; left=$(budget_left); echo $(($1 < left ? $1 : (left > 1 ? left : 1))); }
