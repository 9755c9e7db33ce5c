#!/usr/bin/env bash
# The SSD prefill kernels on a GPU: compile, test, profile and benchmark beside vLLM. Run from the repository root
# (tools/gpu/README.md):
#
#     bash tools/gpu/run_ssd_session.sh [stage ...]
#
# Stages (default: precompile tests profile quick bench, in this order; each under its own time limit, cut to
# what is left of $BUDGET (default 570 s, counted from before the setup), so the later ones still run and the
# results are packed before a 600 s limit):
#     precompile  every SSD kernel of the tests and the benchmark, in $JOBS parallel processes
#                 (tools/gpu/precompile.py ssd; limit $PRECOMPILE_S, default 240 s)
#     tests       tests/gpu/test_ssd_kernels.py, junit XML + log (limit $TESTS_S, default 240 s)
#     profile     per-kernel device time of MATE and vLLM (tools/gpu/ssd_profile.py)
#     quick       mate-mamba bench ssd --quick (the headline shape at two batches)
#     bench       mate-mamba bench ssd (the whole plan; writes after every case; gets what is left of $BUDGET)
#   not in the default list (run it by name):
#     ptxas       registers / spills of the planned kernels (tools/gpu/ssd_ptxas.py; nvcc only, no GPU needed)
# $IMPLS (default mate,vllm) is the benchmarks' --impls. Everything goes under $OUT (default ./ssd-session-out),
# and the last step packs it into $OUT/ssd-session.tgz.
OUT="${OUT:-$PWD/ssd-session-out}"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(precompile tests profile quick bench)
# shellcheck source=session_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/session_common.sh"

for stage in "${stages[@]}"; do
    case "$stage" in
    precompile)
        stamp "precompile (jobs $JOBS)"
        timeout "$(stage_limit "${PRECOMPILE_S:-240}")" python3 $G/precompile.py ssd --jobs "$JOBS" \
            >"$OUT/precompile.log" 2>&1
        stamp "precompile rc=$? $(tail -1 "$OUT/precompile.log")"
        ;;
    tests)
        stamp "tests"
        gpu_pytest test_ssd_kernels "${TESTS_S:-240}" $T/test_ssd_kernels.py
        ;;
    ptxas)
        stamp "ptxas"
        timeout "$(stage_limit 90)" python3 $G/ssd_ptxas.py --out "$OUT/ptxas" >"$OUT/ptxas.log" 2>&1
        stamp "ptxas rc=$?"
        ;;
    profile)
        stamp "profile"
        timeout "$(stage_limit 180)" python3 $G/ssd_profile.py >"$OUT/profile.log" 2>&1
        stamp "profile rc=$?"
        ;;
    quick)
        stamp "bench quick (${IMPLS:-mate,vllm})"
        timeout "$(stage_limit 300)" python3 -m mate.mamba bench ssd --quick --impls "${IMPLS:-mate,vllm}" --out "$OUT" \
            --name ssd_quick >"$OUT/bench_quick.log" 2>&1
        stamp "bench quick rc=$?"
        ;;
    bench)
        left=$(budget_left)
        [ "$left" -lt 30 ] && { stamp "bench skipped: ${left}s left"; continue; }
        stamp "bench (${left}s)"
        timeout "$left" python3 -m mate.mamba bench ssd --impls "${IMPLS:-mate,vllm}" --out "$OUT" --name ssd \
            >"$OUT/bench.log" 2>&1
        stamp "bench rc=$?"
        ;;
    *)
        stamp "unknown stage $stage"
        ;;
    esac
done
stamp "done"
tar czf "$OUT/ssd-session.tgz" -C "$OUT" --exclude ssd-session.tgz . 2>/dev/null
