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
#     bench       mate-mamba bench replay --repeats 3 --replays 10 (MATE, FlashInfer, MATE's stored-state decode, the
#                 whole registry): FlashInfer builds one JIT module per (shape, state, T) on first use, minutes
#                 each; the benchmark builds the 8 it needs in 8 worker processes first (about 330 s on the lab's
#                 16 cores when nothing else runs), then times everything in one run (about 150 s). Give it a
#                 call of its own: `bash tools/gpu/run_replay_session.sh bench`
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
    bench)
        left=$(budget_left)
        [ "$left" -lt 30 ] && { stamp "bench skipped: ${left}s left"; continue; }
        stamp "bench (${left}s)"
        timeout "$left" python3 -m mate.mamba bench replay --prebuild-jobs 8 --repeats 3 --replays 10 --out "$OUT" \
            --name replay >"$OUT/bench.log" 2>&1
        stamp "bench rc=$?"
        ;;
    *)
        stamp "unknown stage $stage"
        ;;
    esac
done
stamp "done"
