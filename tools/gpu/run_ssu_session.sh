#!/usr/bin/env bash
# The SSU decode kernels on a GPU, and everything that rides on them: compile, the SSU GPU tests, the adapters'
# and custom ops' GPU tests, the demo, and the benchmark beside vLLM and FlashInfer. Run from the repository
# root (tools/gpu/README.md):
#
#     bash tools/gpu/run_ssu_session.sh [stage ...]
#
# Stages (default: precompile tests adapters demo bench, in this order; each under its own time limit, cut to
# what is left of $BUDGET (default 570 s, counted from before the setup), so later stages still run and partial
# results come back):
#     precompile  every SSU kernel of the tests and the benchmark, PDL builds included, in $JOBS parallel
#                 processes (tools/gpu/precompile.py ssu --pdl)
#     tests       tests/gpu/test_ssu_kernels.py + test_ssu_fast_path_gpu.py, junit XML + log
#     adapters    the gpu-marked tests of the three adapters and of the custom ops (torch.compile on CUDA)
#     demo        mate-mamba demo on the GPU (TileLang backend)
#     bench       mate-mamba bench ssu --pdl (MATE vs vLLM Triton vs FlashInfer, graph-replayed; eager host time per
#                 call; MATE's kernels with programmatic dependent launch as a column of their own)
#   not in the default list (run it by name, e.g. `bash tools/gpu/run_ssu_session.sh precompile bench-pdl`):
#     formats     tests/gpu/test_ssu_quantized_kernels.py + test_ssu_stochastic_rounding_kernels.py (the
#                 block-scaled and stochastically rounded states), junit XML + log
#     bench-pdl   mate-mamba bench ssu --quick --after-producer --pdl: every call after a kernel that rewrites its
#                 inputs (a conv1d's place), written as ssu-after-producer.{md,json,png}
# Everything goes under $OUT (default ./ssu-session-out).
OUT="${OUT:-$PWD/ssu-session-out}"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(precompile tests adapters demo bench)
# shellcheck source=session_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/session_common.sh"

for stage in "${stages[@]}"; do
    case "$stage" in
    precompile)
        stamp "precompile (jobs $JOBS)"
        timeout "$(stage_limit 180)" python3 $G/precompile.py ssu --pdl --jobs "$JOBS" >"$OUT/precompile.log" 2>&1
        stamp "precompile rc=$? $(tail -1 "$OUT/precompile.log")"
        ;;
    tests)
        stamp "tests"
        gpu_pytest test_ssu_kernels 260 $T/test_ssu_kernels.py $T/test_ssu_fast_path_gpu.py
        ;;
    formats)
        stamp "formats"
        gpu_pytest test_ssu_formats 260 $T/test_ssu_quantized_kernels.py $T/test_ssu_stochastic_rounding_kernels.py
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
        timeout "$(stage_limit 120)" python3 -m mate.mamba demo >"$OUT/demo.log" 2>&1
        stamp "demo rc=$? $(tail -1 "$OUT/demo.log")"
        ;;
    bench)
        left=$(budget_left)
        [ "$left" -lt 30 ] && { stamp "bench skipped: ${left}s left"; continue; }
        stamp "bench (${left}s)"
        timeout "$left" python3 -m mate.mamba bench ssu --pdl --out "$OUT" --name ssu >"$OUT/bench.log" 2>&1
        stamp "bench rc=$?"
        ;;
    bench-pdl)
        left=$(budget_left)
        [ "$left" -lt 30 ] && { stamp "bench-pdl skipped: ${left}s left"; continue; }
        stamp "bench-pdl (${left}s)"
        timeout "$left" python3 -m mate.mamba bench ssu --quick --after-producer --pdl --out "$OUT" \
            --name ssu-after-producer >"$OUT/bench-pdl.log" 2>&1
        stamp "bench-pdl rc=$?"
        ;;
    *)
        stamp "unknown stage $stage"
        ;;
    esac
done
stamp "done"
