#!/usr/bin/env bash
# The kernel changes merged without a GPU (2026-12-06/07), timed against the kernels they replaced, the peers in
# the same run, and their GPU tests. Two steps, from the repository root:
#
#     bash tools/gpu/run_pending_ab.sh prepare      # where git is: the base variants under .gpu-run/ab/
#     bash tools/gpu/run_pending_ab.sh [stage ...]  # on the GPU machine (carry .gpu and .gpu-run)
#
# Variants (tools/gpu/ab.sh): head (this tree); k03 = 03cc070 (before the conv1d prefill rewrite and the packed
# SSU's fp32 B/C staging); k606 = 606a573 (before the conv1d update rewrite, the ReplaySSM table design and the
# decode step's three-launch route); q0 = 4a9eafd (before the staged int8 / fp8 kernel's rows wrote y after the
# last row); cl = 40cc69c (branch h4-cluster, not merged: the fused decode step's cluster design, whose bench layer
# times both of the fused kernel's designs). Stages, in this order by default, each under its own limit cut to what
# is left of $BUDGET (default 570 s; the GPU machine's limit is 600 s a command, so two calls take the default set):
#     cluster  bench layer of variant cl --batches 1,2,4,8,16,64 --impls mate,mate-counters,three-ops: the cluster
#              design against the counters design and the peers' sequence (the decision h4-cluster waits for)
#     tests    the GPU tests of the untimed kernels (conv1d, replay + materialisation, decode step, SSU formats,
#              the SSD fast path)
#     ssu      bench ssu --quick --state int8,fp8,bf16 --batches 64: head with vLLM and FlashInfer, k03 and q0
#              MATE only
#     conv     bench conv1d --quick: head with vLLM, k03 (prefill) and k606 (update) MATE only
#     replay   bench replay, Nemotron-H 8B bf16 T 1 / 6 at batch 1 / 8 / 64, MATE only: head and k606 (FlashInfer's
#              JIT build takes ~330 s: its numbers come from docs/benchmarks/replay.json or a session of its own)
#     layer    bench layer --batches 1,8,16,64,256: the decode step against vLLM's conv1d + MATE's SSU + vLLM's norm
#     host     bench ssd --quick --impls mate,vllm: the prefill's eager host time, head and k606
# Results under $OUT (default ./pending-ab-out).
set -uo pipefail
if [ "${1:-}" = prepare ]; then
    bash tools/gpu/ab.sh prepare k03 03cc070 && bash tools/gpu/ab.sh prepare k606 606a573 &&
        bash tools/gpu/ab.sh prepare q0 4a9eafd && bash tools/gpu/ab.sh prepare cl 40cc69c || exit $?
    # only the packages the benchmarks import travel (the working tree's carry is 64 MiB with the .gpu bundles)
    rm -rf .gpu-run/ab/*/packages/mate-{flashinfer-compat,sglang,vllm}
    exit $?
fi
OUT="${OUT:-$PWD/pending-ab-out}"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(cluster tests ssu conv replay layer host)
# shellcheck source=session_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/session_common.sh"
# The lab's vLLM bundle lacks compute_causal_conv1d_metadata (vLLM's prefill conv1d rows need it): where a copy of
# it from the vLLM 0.33 wheel's v1/attention/backends/utils.py is at .gpu-run/ccm_patch.py, it is added.
vutils=/tmp/mate-peers/vllm/v1/attention/backends/utils.py
if [ -f .gpu-run/ccm_patch.py ] && [ -f $vutils ] && ! grep -q "def compute_causal_conv1d_metadata" $vutils; then
    cat .gpu-run/ccm_patch.py >>$vutils
fi
ab() { # name limit variant bench-args...
    local name=$1 limit=$2 variant=$3
    shift 3
    local left
    left=$(budget_left)
    [ "$left" -lt 30 ] && { stamp "$name skipped: ${left}s left"; return; }
    timeout "$(stage_limit "$limit")" bash "$G/ab.sh" bench "$variant" "$@" --out "$OUT" --name "$name" \
        >"$OUT/$name.log" 2>&1
    stamp "$name rc=$? $(tail -1 "$OUT/$name.log")"
}
for stage in "${stages[@]}"; do
    case "$stage" in
    tests)
        gpu_pytest pending_tests 240 $T/test_conv1d_kernels.py $T/test_replay_kernels.py \
            $T/test_materialize_kernels.py $T/test_decode_step_kernels.py $T/test_ssu_quantized_kernels.py \
            $T/test_ssd_fast_path_gpu.py
        ;;
    cluster)
        ab layer-cl 150 cl layer --batches 1,2,4,8,16,64 --impls mate,mate-counters,three-ops
        ;;
    ssu)
        ab ssu-head 150 head ssu --quick --state int8,fp8,bf16 --batches 64
        ab ssu-k03 90 k03 ssu --quick --state int8,fp8 --batches 64 --impls mate
        ab ssu-q0 90 q0 ssu --quick --state int8,fp8 --batches 64 --impls mate
        ;;
    conv)
        ab conv-head 120 head conv1d --quick
        ab conv-k03 60 k03 conv1d --quick --ops fn --impls mate
        ab conv-k606 60 k606 conv1d --quick --ops update --impls mate
        ;;
    replay)
        ab replay-head 120 head replay --impls mate --batches 1,8,64 --tokens 1,6 --state bf16 --models nemotron-h-8b-tp1 --phases cycle
        ab replay-k606 120 k606 replay --impls mate --batches 1,8,64 --tokens 1,6 --state bf16 --models nemotron-h-8b-tp1 --phases cycle
        ;;
    layer)
        ab layer-head 120 head layer --batches 1,8,16,64,256
        ;;
    host)
        ab ssd-head 150 head ssd --quick --impls mate,vllm
        ab ssd-k606 120 k606 ssd --quick --impls mate
        ;;
    *)
        stamp "unknown stage $stage"
        ;;
    esac
done
stamp "done"
