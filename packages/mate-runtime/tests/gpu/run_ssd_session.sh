#!/usr/bin/env bash
# One GPU device call for the SSD prefill kernels: compile, test both launcher variants, benchmark both beside
# vLLM. Run from the repository root on the GPU machine, carrying .gpu (see /work/shared/gpu/README.md):
#
#     bash packages/mate-runtime/tests/gpu/run_ssd_session.sh [stage ...]
#
# Stages (default: all, in this order; each under its own time limit so the later ones still run and the
# partial results come back):
#     precompile  every SSD kernel of the tests and the benchmark, both variants, in parallel processes
#     tests       tests/gpu/test_ssd_kernels.py (every case for fused and split), junit XML + log
#     ptxas       registers / spills / shared memory of the split kernels (nvcc -Xptxas -v on TileLang's source)
#     quick       mate bench ssd --quick --variants fused,split (headline shape, two batches)
#     bench       mate bench ssd --variants fused,split (the whole plan; writes after every shape)
#     quick-io    (not in the default list) the quick bench of split with MATE_SSD_SPLIT_LOCAL=io (local states
#                 in bf16: less traffic) and MATE_SSD_SPLIT_HEADS=${SPLIT_HEADS:-4}; compiles its kernels on the fly
# Everything goes under $OUT (default ./ssd-session-out). Budget on the H200: precompile ~2 min on 16 cores,
# tests ~2 min, quick ~1 min, bench the rest of the 10-minute call.
OUT="${OUT:-$PWD/ssd-session-out}"
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(precompile tests ptxas quick bench)
if [ -f .gpu/setup.sh ]; then
    # sourced in this shell (not in a pipeline: its exports must stay)
    # shellcheck disable=SC1091
    source .gpu/setup.sh --peers >"$OUT/setup.log" 2>&1
    cat "$OUT/setup.log"
fi
export TILELANG_CACHE_DIR="${TILELANG_CACHE_DIR:-$HOME/.tilelang/cache}"
JOBS="${JOBS:-$(nproc)}"
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$OUT/session.log"; }

for stage in "${stages[@]}"; do
    case "$stage" in
    precompile)
        stamp "precompile (jobs $JOBS)"
        timeout 240 python3 packages/mate-runtime/tests/gpu/ssd_precompile.py --jobs "$JOBS" --variants fused,split \
            >"$OUT/precompile.log" 2>&1
        stamp "precompile rc=$? ($(grep -c '^precompiled' "$OUT/precompile.log") ok, $(grep -c FAILED "$OUT/precompile.log") failed)"
        ;;
    tests)
        # one process per variant: a fault in the (never run) split kernels cannot take the fused results down
        for v in fused split; do
            stamp "tests $v"
            timeout 150 python3 -m pytest -m gpu -q -rA -p no:cacheprovider -k "$v" \
                packages/mate-runtime/tests/gpu/test_ssd_kernels.py --junitxml="$OUT/test_ssd_kernels_$v.xml" \
                >"$OUT/tests_$v.log" 2>&1
            stamp "tests $v rc=$? $(tail -1 "$OUT/tests_$v.log")"
        done
        ;;
    ptxas)
        stamp "ptxas"
        timeout 90 python3 packages/mate-runtime/tests/gpu/ssd_ptxas.py --out "$OUT/ptxas" >"$OUT/ptxas.log" 2>&1
        stamp "ptxas rc=$?"
        ;;
    quick)
        stamp "bench quick"
        timeout 120 python3 -m mate.bench.ssd --quick --variants fused,split --out "$OUT" --name ssd_quick \
            >"$OUT/bench_quick.log" 2>&1
        rc=$?
        stamp "bench quick rc=$rc"
        if [ "$rc" -ne 0 ]; then  # e.g. a device fault in split: keep a fused-vs-vLLM measurement
            timeout 90 python3 -m mate.bench.ssd --quick --variants fused --out "$OUT" --name ssd_quick_fused \
                >"$OUT/bench_quick_fused.log" 2>&1
            stamp "bench quick (fused only) rc=$?"
            BENCH_VARIANTS=fused
        fi
        ;;
    quick-io)
        stamp "bench quick, split with bf16 local states, ${SPLIT_HEADS:-4} heads per CTA"
        MATE_SSD_SPLIT_LOCAL=io MATE_SSD_SPLIT_HEADS="${SPLIT_HEADS:-4}" timeout 240 python3 -m mate.bench.ssd --quick \
            --variants split --out "$OUT" --name ssd_quick_split_io >"$OUT/bench_quick_io.log" 2>&1
        stamp "bench quick-io rc=$?"
        ;;
    bench)
        left=$((${BUDGET:-570} - ($(date +%s) - t0)))
        [ "$left" -lt 30 ] && { stamp "bench skipped: ${left}s left"; continue; }
        stamp "bench ${BENCH_VARIANTS:-fused,split} (${left}s)"
        timeout "$left" python3 -m mate.bench.ssd --variants "${BENCH_VARIANTS:-fused,split}" --out "$OUT" --name ssd_variants \
            >"$OUT/bench.log" 2>&1
        stamp "bench rc=$?"
        ;;
    *)
        stamp "unknown stage $stage"
        ;;
    esac
done
stamp "done"
