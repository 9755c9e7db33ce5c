"""Where the chained SSD kernel's time goes: device time of one launch at a benchmark shape with the chain as
built, with the spin's sleep removed, with one CTA per SM, and with the chain cut (every tile starts from its
initial state: the result is wrong, the time is the state-independent throughput).
``python packages/mate-runtime/tests/gpu/ssd_chain_probe.py``."""

from __future__ import annotations

import sys

import torch

PROBES = (
    ("as built", {}),
    ("no sleep", {"sleep_ns": 0}),
    ("1 CTA/SM", {"min_blocks": 1}),
    ("chain cut", {"chain": False}),
)


def main() -> int:
    from mate._tilelang import ssd as tl_ssd
    from mate._tilelang.cache import compile_prim_func
    from mate.bench.ssd import BATCHES, SSD_SHAPES, make_window
    from mate.mamba._ssd_call import normalize_ssd
    from mate_kernels import ssd as kssd

    dev = torch.device("cuda")
    for shape, batch, L in (("nemotron-h-8b", "1x8192", 256), ("mamba2-2.7b", "1x8192", 256)):
        s = SSD_SHAPES[shape]
        H, G, P, N = s.heads, s.groups, s.dim, s.dstate
        w = make_window(s, BATCHES[batch], L, 7, dev)
        m = w["meta"]
        call = normalize_ssd(w["x"], w["dt"], w["A"], w["B"], w["C"], L, m.cu_seqlens, m.cu_chunk_seqlens,
                             m.last_chunk_indices, m.seq_idx, out=w["out"], D=w["D"], dt_bias=w["dt_bias"],
                             dt_softplus=True, initial_states=w["init"], state_dtype=torch.float32)  # fmt: skip
        key, _ = tl_ssd.kernel_keys(call, "chained")
        io, state, init, dt, dtb, D, dpd, _cu, _sq, sp, lo, hi, hdtb, hD, inter = key[6:]
        tiles = tl_ssd.plan_chained(P, N, L, torch.bfloat16)
        states = torch.empty(m.last_chunk_indices.numel(), H, P, N, device=dev)
        ring = torch.empty(tiles["ring"], H, N, P, device=dev)
        sync = torch.zeros(kssd.chained_sync_words(heads=H, dim=P, ring=tiles["ring"]), dtype=torch.int32, device=dev)
        dest = torch.full((m.seq_idx.numel(),), -1, dtype=torch.int32, device=dev)
        z = torch.zeros(1, H, P, dtype=torch.bfloat16, device=dev)
        for label, extra in PROBES:
            kern = compile_prim_func(
                kssd.ssd_chained_kernel(heads=H, groups=G, dim=P, dstate=N, chunk_size=L, io_dtype=io,
                                        state_dtype=state, init_dtype=init, dt_dtype=dt, dt_bias_dtype=dtb,
                                        D_dtype=D, D_per_dim=dpd, has_dt_bias=hdtb, dt_softplus=sp, dt_min=lo,
                                        dt_max=hi, has_D=hD, intermediate=inter, **{**tiles, **extra}),
                target="auto",
            )  # fmt: skip

            args = (call.x, call.dt, call.A, call.B, call.C, m.cu_chunk_seqlens, m.seq_idx, dest, w["dt_bias"],
                    w["D"], z, w["init"], w["out"], states, ring, sync, kssd.FLAG_INIT)  # fmt: skip

            def launch(kern=kern, args=args, sync=sync):
                sync.zero_()
                kern(*args)

            launch()
            torch.cuda.synchronize()
            errs = int(sync[kssd.SYNC_ERRORS].item())
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(10):
                launch()
            e1.record()
            torch.cuda.synchronize()
            us = e0.elapsed_time(e1) / 10 * 1000
            print(f"{shape} {batch} chunk {L} chained {label}: {us:.1f} us (spin errors {errs})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
