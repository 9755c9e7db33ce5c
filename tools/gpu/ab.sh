#!/usr/bin/env bash
# A/B runs of the project's benchmarks across commits, in one GPU session (MATE's kernels of two commits side by
# side, the peers in the same run). Two steps, run from the repository root:
#
#     bash tools/gpu/ab.sh prepare NAME COMMIT [PATCH]   # where git is: COMMIT's packages/*/src (PATCH applied,
#                                                        # if given) under .gpu-run/ab/NAME/ (git-ignored)
#     bash tools/gpu/ab.sh bench NAME ARGS...            # on the GPU machine (carry .gpu-run): mate-mamba bench
#                                                        # ARGS with variant NAME's packages first on PYTHONPATH
#
# NAME "head" is the working tree itself (nothing to prepare). Each variant compiles into its own MATE_CACHE_DIR
# (/tmp/mc-NAME: MATE's disk cache is keyed by kernel spec, not by source). Give each run its own --name so the
# reports do not overwrite each other. On the lab machine, source .gpu/setup.sh --peers first (it puts TileLang
# and the peers on PYTHONPATH; this script keeps what is there and prepends the variant's packages).
set -euo pipefail
cmd=${1:?usage: ab.sh prepare NAME COMMIT [PATCH] | ab.sh bench NAME ARGS...}
name=${2:?variant name}
shift 2
dir=.gpu-run/ab/$name
case "$cmd" in
prepare)
    commit=${1:?commit}
    rm -rf "$dir" && mkdir -p "$dir"
    git archive "$commit" packages | tar -x -C "$dir" --wildcards 'packages/*/src'
    if [ -n "${2:-}" ]; then patch -d "$dir" -p1 <"$2"; fi
    grep -qs '^/.gpu-run/' .gitignore "$(git rev-parse --git-common-dir)/info/exclude" ||
        echo "note: .gpu-run/ is not ignored here; it travels as untracked files" >&2
    echo "$dir: $(git rev-parse --short "$commit")${2:+ + $2}"
    ;;
bench)
    root=$PWD
    [ "$name" != head ] && root=$PWD/$dir
    [ -d "$root/packages" ] || { echo "no variant $name (run: ab.sh prepare $name COMMIT)" >&2; exit 2; }
    src=$(ls -d "$root"/packages/*/src | tr '\n' ':')
    MATE_CACHE_DIR=/tmp/mc-$name PYTHONPATH="$src${PYTHONPATH:-}" exec python3 -m mate.mamba bench "$@"
    ;;
*)
    echo "unknown command $cmd" >&2
    exit 2
    ;;
esac
