#!/usr/bin/env bash
# The ReplaySSM kernels on a GPU: compile, their GPU tests, and the benchmark beside FlashInfer's checkpointing_ssu
# and MATE's stored-state decode. Run from the repository root (tools/gpu/README.md):
#
#     bash tools/gpu/run_replay_session.sh [stage ...]
#
# Stages (default: precompile tests, in this order; each under its own time limit, cut to what is left of $BUDGET,
# default 570 s counted from before the setup):
#     precompile  every ReplaySSM kernel of the tests and the benchmark, in $JOBS parallel processes
#     tests       tests/gpu/test_replay_kernels.py + test_materialize_kernels.py, junit XML + log
#     prebuild    mate-mamba bench replay --prebuild-only: FlashInfer's JIT module (minutes each) and MATE's kernels of
#                 every (shape, state, T) of the grid, in $PREBUILD_JOBS (default 12) worker processes. The grid has
#                 24; $BENCH_ARGS (e.g. "--models nemotron-h-8b-tp1") selects fewer, so that two calls of their own
#                 build half each on a machine whose caches persist
#     bench       mate-mamba bench replay --prebuild-jobs 0 --repeats 3 --replays 10 $BENCH_ARGS (MATE, FlashInfer,
#                 MATE's stored-state decode): the timing alone, about 3-5 minutes for the whole grid once built
# Everything goes under $OUT (default ./replay-session-out).
OUT="${OUT:-$PWD/replay-session-out}"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(precompile tests)
# shellcheck source=session_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/session_common.sh"
# the lab's FlashInfer bundle lacks checkpointing_ssu's CUDA sources: a tarball of them beside it fills them in
# (tools/gpu/README.md says how to make it)
if [ -f .gpu/fi_ckpt_csrc.tar.xz ] && [ -d /tmp/mate-peers/flashinfer ]; then
    tar -xJf .gpu/fi_ckpt_csrc.tar.xz -C /tmp/mate-peers
fi

for stage in "${stages[@]}"; do
    case "$stage" in
    precompile)
        stamp "precompile (jobs $JOBS)"
        timeout "$(stage_limit 120)" python3 $G/precompile.py replay --jobs "$JOBS" >"$OUT/precompile.log" 2>&1
        stamp "precompile rc=$? $(tail -1 "$OUT/precompile.log")"
        ;;
    tests)
        stamp "tests"
        gpu_pytest test_replay_kernels 200 $T/test_replay_kernels.py $T/test_materialize_kernels.py
        ;;
    prebuild)
        stamp "prebuild (jobs ${PREBUILD_JOBS:-12}) $BENCH_ARGS"
        # shellcheck disable=SC2086
        timeout "$(stage_limit 570)" python3 -m mate.mamba bench replay --prebuild-only \
            --prebuild-jobs "${PREBUILD_JOBS:-12}" $BENCH_ARGS >"$OUT/prebuild.log" 2>&1
        stamp "prebuild rc=$? $(grep -c ': built' "$OUT/prebuild.log") built, $(grep -c ': failed' "$OUT/prebuild.log") failed"
        ;;
    bench)
        left=$(budget_left)
        [ "$left" -lt 30 ] && { stamp "bench skipped: ${left}s left"; continue; }
        stamp "bench (${left}s)"
        # shellcheck disable=SC2086
        timeout "$left" python3 -m mate.mamba bench replay --prebuild-jobs 0 --repeats 3 --replays 10 --out "$OUT" \
            --name replay $BENCH_ARGS >"$OUT/bench.log" 2>&1
        stamp "bench rc=$?"
        ;;
    *)
        stamp "unknown stage $stage"
        ;;
    esac
done
stamp "done"
