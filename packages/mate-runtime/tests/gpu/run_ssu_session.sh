#!/usr/bin/env bash
# One GPU device call for the SSU decode kernels and everything that rides on them: compile, the SSU GPU tests,
# the eager fast path's GPU tests, the adapters' and custom ops' GPU tests, the demo, and the benchmark beside
# vLLM and FlashInfer. Run from the repository root on the GPU machine, carrying .gpu
# (see /work/shared/gpu/README.md):
#
#     bash packages/mate-runtime/tests/gpu/run_ssu_session.sh [stage ...]
#
# Stages (default: all, in this order; each under its own time limit, so later stages still run and partial
# results come back):
#     precompile  every SSU kernel the tests use, in parallel processes (tests/gpu/precompile_ssu.py)
#     tests       tests/gpu/test_ssu_kernels.py + test_ssu_fast_path_gpu.py (the fast path's direct tvm_ffi
#                 call has only been checked on the CPU so far), junit XML + log
#     adapters    the gpu-marked tests of the three adapters and of the custom ops (torch.compile on CUDA)
#     demo        mate demo on the GPU (TileLang backend)
#     bench       mate bench ssu (MATE vs vLLM Triton vs FlashInfer, graph-replayed; eager host time per call), with
#                 MATE's kernels with programmatic dependent launch (MATE_SSU_PDL=1) as a column of their own
#   not in the default list (run it by name, e.g. `... run_ssu_session.sh precompile bench-bf16`):
#     bench-bf16  the bf16-state A/B (docs/ssu-kernels.md, "bf16 state: what the generated code shows"): bf16
#                 cases of `mate bench ssu --quick`, default kernels beside two other MATE_SSU_BF16_* settings (the
#                 first: the fourth session's default, the second: the sixth session's packed kernel) and
#                 the peers, written as ssu-bf16-ab.{md,json,png}
#     bench-reduce the row reduction of y = s . C (eleventh session): `mate bench ssu --quick` with the default
#                 (transposed) beside MATE_SSU_TRANSPOSED_REDUCE=0 (every row reduced on its own, the kernels
#                 before) and the peers, written as ssu-transposed-reduce.{md,json,png}
#     bench-f32   the fp32-state A/B of the packed kernel's register cap (MATE_SSU_F32_PACKED_MIN_BLOCKS 6 and 5
#                 beside the default, no cap): fp32 cases of `mate bench ssu` (MTP 6 at batch 8 and 64 included),
#                 written as ssu-f32-ab.{md,json,png}; then `gpu_pytest` of test_f32_packed_register_cap
#     bench-pdl   `mate bench ssu --quick --after-producer`: every call after a kernel that rewrites its inputs (a
#                 conv1d's place), default beside MATE_SSU_PDL=1, written as ssu-after-producer.{md,json,png}
# Everything goes under $OUT (default ./ssu-session-out).
OUT="${OUT:-$PWD/ssu-session-out}"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(precompile tests adapters demo bench)
# shellcheck source=session_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/session_common.sh"
gpu_pytest() {  # name, time limit, test paths...
    local name=$1 limit=$2
    shift 2
    timeout "$limit" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider "$@" --junitxml="$OUT/$name.xml" \
        >"$OUT/$name.log" 2>&1
    stamp "$name rc=$? $(tail -1 "$OUT/$name.log")"
}

for stage in "${stages[@]}"; do
    case "$stage" in
    precompile)
        stamp "precompile (jobs $JOBS)"
        timeout 180 python3 packages/mate-runtime/tests/gpu/precompile_ssu.py "$JOBS" >"$OUT/precompile.log" 2>&1
        stamp "precompile rc=$? $(tail -1 "$OUT/precompile.log")"
        ;;
    tests)
        stamp "tests"
        gpu_pytest test_ssu_kernels 260 packages/mate-runtime/tests/gpu/test_ssu_kernels.py \
            packages/mate-runtime/tests/gpu/test_ssu_fast_path_gpu.py
        ;;
    adapters)
        stamp "adapters"
        # one pytest run per package: their test modules are not packages, so names must not meet
        for t in packages/mate-flashinfer-compat/tests packages/mate-vllm/tests packages/mate-sglang/tests \
            packages/mate-runtime/tests/test_ops_compile.py; do
            gpu_pytest "gpu_$(basename "$(dirname "$t")")_$(basename "$t" .py)" 120 "$t"
        done
        ;;
    demo)
        stamp "demo"
        timeout 120 python3 -m mate demo >"$OUT/demo.log" 2>&1
        stamp "demo rc=$? $(tail -1 "$OUT/demo.log")"
        ;;
    bench)
        left=$(budget_left)
        [ "$left" -lt 30 ] && { stamp "bench skipped: ${left}s left"; continue; }
        stamp "bench (${left}s)"
        timeout "$left" python3 -m mate.bench.ssu --out "$OUT" --name ssu --env MATE_SSU_PDL=1 >"$OUT/bench.log" 2>&1
        stamp "bench rc=$?"
        ;;
    bench-bf16)
        left=$(budget_left)
        [ "$left" -lt 30 ] && { stamp "bench-bf16 skipped: ${left}s left"; continue; }
        stamp "bench-bf16 (${left}s)"
        timeout "$left" python3 -m mate.bench.ssu --quick --state bf16 --out "$OUT" --name ssu-bf16-ab \
            --env MATE_SSU_BF16_PACK=0,MATE_SSU_BF16_MIN_BLOCKS=0,MATE_SSU_BF16_PACKED_MIN_BLOCKS=0,MATE_SSU_BF16_PACKED_CHUNKS=4 \
            --env MATE_SSU_BF16_PACKED_MIN_BLOCKS=4,MATE_SSU_BF16_PACKED_CHUNKS=4 \
            >"$OUT/bench-bf16.log" 2>&1
        stamp "bench-bf16 rc=$?"
        ;;
    bench-f32)
        gpu_pytest f32-option 120 packages/mate-runtime/tests/gpu/test_ssu_kernels.py -k f32_packed_register_cap
        left=$(budget_left)
        [ "$left" -lt 30 ] && { stamp "bench-f32 skipped: ${left}s left"; continue; }
        stamp "bench-f32 (${left}s)"
        timeout "$left" python3 -m mate.bench.ssu --state fp32 --out "$OUT" --name ssu-f32-ab \
            --env MATE_SSU_F32_PACKED_MIN_BLOCKS=6 --env MATE_SSU_F32_PACKED_MIN_BLOCKS=5 \
            >"$OUT/bench-f32.log" 2>&1
        stamp "bench-f32 rc=$?"
        ;;
    bench-reduce)
        left=$(budget_left)
        [ "$left" -lt 30 ] && { stamp "bench-reduce skipped: ${left}s left"; continue; }
        stamp "bench-reduce (${left}s)"
        timeout "$left" python3 -m mate.bench.ssu --quick --out "$OUT" --name ssu-transposed-reduce \
            --env MATE_SSU_TRANSPOSED_REDUCE=0 >"$OUT/bench-reduce.log" 2>&1
        stamp "bench-reduce rc=$?"
        ;;
    bench-pdl)
        left=$(budget_left)
        [ "$left" -lt 30 ] && { stamp "bench-pdl skipped: ${left}s left"; continue; }
        stamp "bench-pdl (${left}s)"
        timeout "$left" python3 -m mate.bench.ssu --quick --after-producer --out "$OUT" --name ssu-after-producer \
            --env MATE_SSU_PDL=1 >"$OUT/bench-pdl.log" 2>&1
        stamp "bench-pdl rc=$?"
        ;;
    *)
        stamp "unknown stage $stage"
        ;;
    esac
done
stamp "done"
