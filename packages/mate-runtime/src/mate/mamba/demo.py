"""``mate-mamba demo``: one Mamba2 layer's worth of work on a Nemotron-like shape, checked against the float64
recurrence.

A prefill of a ragged batch through ``ssd_combined_fwd_varlen``, decode steps and one MTP step through
``selective_state_update``, each result compared with :func:`mate.mamba.testing.step` run token by token,
independently of the reference backend; then the eager time per call. Exits non-zero if any result is off.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass


class UsageError(ValueError):
    """A bad command-line value: reported in one line with exit status 2."""


@dataclass
class Check:
    what: str
    err: float  # max |got - want| / max |want|
    tol: float

    @property
    def ok(self) -> bool:
        return self.err <= self.tol  # NaN fails


def rel_err(got, want) -> float:
    got, want = got.double(), want.double()
    scale = float(want.abs().max()) if want.numel() else 0.0
    return float((got - want).abs().max()) / max(scale, 1e-12) if want.numel() else 0.0


class Recurrence:
    """The demo's independent oracle: :func:`mate.mamba.testing.step`, the float64 token-by-token recurrence, with the
    layer's A, D and dt_bias (``dt' = softplus(dt + dt_bias)``, one value per head)."""

    def __init__(self, A, D, dt_bias, groups: int):
        self.A, self.D, self.dt_bias = A, D, dt_bias

    def step(self, s, x, dt, B, C, z):
        """s [H, P, N] float64 (updated in place), x/z [H, P], dt [H] raw, B/C [G, N]; returns y [H, P]."""
        from mate.mamba.testing import discretize_dt, step

        H, P, N = s.shape
        d = discretize_dt(dt, self.dt_bias, dt_softplus=True)[:, None].expand(H, P)
        s_new, y = step(s, x, d, self.A.view(H, 1, 1).expand(H, P, N), B, C, self.D[:, None].expand(H, P), z)
        s.copy_(s_new)
        return y


def _sync(device):
    from mate.mamba._platform.device import synchronize

    synchronize(device)


def _timed(fn, device):
    _sync(device)
    t0 = time.perf_counter()
    result = fn()
    _sync(device)
    return result, time.perf_counter() - t0


def _steady(fn, device, reps: int) -> float:
    """Median seconds per call over ``reps`` calls (each synchronised)."""
    times = []
    for _ in range(reps):
        times.append(_timed(fn, device)[1])
    return statistics.median(times)


def _fmt_time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def _parse_seqlens(text: str) -> list[int]:
    try:
        lens = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--seqlens: got {text!r}; expected comma-separated positive ints, e.g. 137,300,1") from None
    if not lens or min(lens) < 1:
        raise UsageError(f"--seqlens: got {text!r}; expected comma-separated positive ints, e.g. 137,300,1")
    return lens


DEMO_SHAPES = {
    # accelerator: Nemotron-H 8B per rank at TP1; cpu: the same head geometry with fewer heads so it runs in seconds.
    "accelerator": dict(heads=128, groups=8, seqlens="137,4000,1,900,3000", reps=20),
    "cpu": dict(heads=16, groups=2, seqlens="137,300,1,64", reps=3),
}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def parse_device(text: str):
    """The ``--device`` value as a usable torch device, else a UsageError in one line (an unknown name, or an
    accelerator this torch build or machine does not have)."""
    import torch
    from mate.mamba._platform.device import ACCELERATOR_TYPES

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device: got {text!r}; expected auto, cpu, cuda, cuda:N or musa") from None
    if device.type == "cpu":
        return device
    if device.type not in ACCELERATOR_TYPES:
        raise UsageError(f"--device: got {text!r}; expected auto, cpu, cuda, cuda:N or musa")
    mod = getattr(torch, device.type, None)
    try:
        count = mod.device_count() if mod is not None and mod.is_available() else 0
    except Exception:  # a torch build without that backend reports through exceptions
        count = 0
    if count == 0:
        build = f"torch {torch.__version__}" + (
            " (a CPU-only build)" if device.type == "cuda" and not torch.version.cuda else ""
        )
        raise UsageError(f"--device: got {text!r}; no {device.type} device is usable with {build}; try --device cpu")
    if device.index is not None and device.index >= count:
        raise UsageError(f"--device: got {text!r}; expected an index below {count} (the {device.type} devices here)")
    return device


def cmd_demo(args: argparse.Namespace) -> int:
    import torch
    from mate.mamba import selective_state_update, ssd_combined_fwd_varlen
    from mate.mamba._dispatch import resolve_backend
    from mate.mamba._platform.device import default_accelerator
    from mate.mamba.chunking import chunk_metadata

    if args.device == "auto":
        device = default_accelerator() or torch.device("cpu")
    else:
        device = parse_device(args.device)
    defaults = DEMO_SHAPES["cpu" if device.type == "cpu" else "accelerator"]
    H = args.heads if args.heads is not None else defaults["heads"]
    G = args.groups if args.groups is not None else defaults["groups"]
    P, N, L = args.dim, args.dstate, args.chunk_size
    seqlens = _parse_seqlens(args.seqlens or defaults["seqlens"])
    reps = args.reps if args.reps is not None else defaults["reps"]
    T_mtp, steps = args.mtp_tokens, args.decode_steps
    for name, v in (("--heads", H), ("--groups", G), ("--dim", P), ("--dstate", N), ("--mtp-tokens", T_mtp)):
        if v < 1:
            raise UsageError(f"{name}: got {v}; expected a positive int")
    if H % G:
        raise UsageError(f"--groups: got {G}; expected a divisor of --heads ({H})")
    if steps < 0 or reps < 0:
        raise UsageError("--decode-steps and --reps: expected non-negative ints")
    io_dtype = getattr(torch, DTYPES[args.dtype])
    state_dtype = torch.float32
    tol = args.tol if args.tol is not None else (5e-3 if io_dtype == torch.float32 else 3e-2)
    backend = resolve_backend(args.backend, device)
    batch, total = len(seqlens), sum(seqlens)

    print(
        f"mate-mamba demo: one Mamba2 layer on {device}, backend {backend!r}"
        + (" (the pure-PyTorch reference)" if backend == "torch" else " (TileLang kernels)"),
        flush=True,
    )
    print(
        f"  shape: heads {H}, head_dim {P}, d_state {N}, groups {G}, chunk {L}; x/B/C/z {args.dtype}, "
        f"state fp32, A/D/dt_bias fp32 per head, dt_softplus",
        flush=True,
    )
    if backend == "tilelang":
        print("  (the first call of each kernel configuration compiles it: 2-4 s each)", flush=True)

    gen = torch.Generator(device="cpu").manual_seed(args.seed)

    def randn(*shape, dtype=io_dtype, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    # Per-head parameters as a Nemotron-H checkpoint has them: A in [-16, -1], dt_bias = softplus^-1(dt0).
    A = -torch.empty(H).uniform_(0.0, 2.77, generator=gen).exp().to(device)
    dt0 = torch.empty(H).uniform_(-6.9, -2.3, generator=gen).exp()  # dt in [1e-3, 1e-1]
    dt_bias = (dt0 + torch.log(-torch.expm1(-dt0))).to(device)
    D = torch.empty(H).uniform_(0.5, 1.5, generator=gen).to(device)
    ref = Recurrence(A, D, dt_bias, G)
    checks: list[Check] = []
    timings: list[tuple[str, float, float | None]] = []

    # ---- 1. prefill of the ragged batch (fresh sequences: chunks of chunk_size from each sequence's start)
    chunks = chunk_metadata(seqlens, L, device=device)
    cu_seqlens = [0]
    for n in seqlens:
        cu_seqlens.append(cu_seqlens[-1] + n)

    def i32(v):
        return torch.tensor(v, dtype=torch.int32, device=device)

    x, z = randn(total, H, P), randn(total, H, P)
    dt = randn(total, H, dtype=torch.float32, scale=0.5)
    B, C = randn(total, G, N), randn(total, G, N)
    y = torch.empty_like(x)
    meta = dict(
        cu_seqlens=chunks.cu_seqlens,
        cu_chunk_seqlens=chunks.cu_chunk_seqlens,
        last_chunk_indices=chunks.last_chunk_indices,
        seq_idx=chunks.seq_idx,
    )

    def prefill():
        return ssd_combined_fwd_varlen(
            x, dt, A, B, C, L, **meta, out=y, D=D, z=z, dt_bias=dt_bias, dt_softplus=True,
            state_dtype=state_dtype, backend=args.backend,
        )  # fmt: skip

    print(
        f"[1/4] prefill: {batch} sequences of {', '.join(map(str, seqlens))} tokens ({total} in all, "
        f"{chunks.nchunks} chunks) through ssd_combined_fwd_varlen",
        flush=True,
    )
    final, t_first = _timed(prefill, device)
    t_steady = _steady(prefill, device, reps) if reps else None
    timings.append(("ssd_combined_fwd_varlen", t_first, t_steady))

    print(f"      recurrence over the same {total} tokens, one at a time (float64) ...", flush=True)
    states = torch.zeros(batch, H, P, N, dtype=torch.float64, device=device)
    y_want = torch.empty(total, H, P, dtype=torch.float64, device=device)
    t0 = time.perf_counter()
    last_report = t0
    for b, n in enumerate(seqlens):
        for t in range(cu_seqlens[b], cu_seqlens[b] + n):
            y_want[t] = ref.step(states[b], x[t], dt[t], B[t], C[t], z[t])
            if time.perf_counter() - last_report > 5.0:
                last_report = time.perf_counter()
                print(f"      ... {t + 1}/{total} tokens", flush=True)
    checks.append(Check("prefill y", rel_err(y, y_want), tol))
    checks.append(Check("prefill final states", rel_err(final, states), tol))
    for c in checks[-2:]:
        print(f"      {c.what:<24} max err {c.err:.2e} (tol {c.tol:.0e})", flush=True)

    # ---- the slot pool: slot 0 unused, one live slot per sequence, scratch slots for the MTP step.
    S = 1 + batch + 2 * batch * T_mtp
    pool = torch.randn(S, H, P, N, generator=gen).to(device=device, dtype=state_dtype)
    live = torch.arange(1, 1 + batch, dtype=torch.int32, device=device).flip(0)  # any order works
    pool[live.long()] = final.to(state_dtype)
    states = pool[live.long()].double()  # continue the oracle from exactly what the pool holds

    def per_head(v, *trail):
        """The tied form production callers pass: one value per head, stride 0 over the trailing dims."""
        return v.view(H, *([1] * len(trail))).expand(H, *trail)

    A_t, D_t, bias_t = per_head(A, P, N), per_head(D, P), per_head(dt_bias, P)

    # ---- 2. one-token decode steps
    print(f"[2/4] decode: {steps} one-token steps of {batch} sequences through selective_state_update", flush=True)
    x1, z1 = randn(batch, H, P), randn(batch, H, P)
    dt1 = randn(batch, H, dtype=torch.float32, scale=0.5)
    B1, C1 = randn(batch, G, N), randn(batch, G, N)
    y1 = torch.empty_like(x1)

    def decode(pool_):
        return selective_state_update(
            pool_, x1, dt1.unsqueeze(-1).expand(batch, H, P), A_t, B1, C1, D_t, z=z1, dt_bias=bias_t,
            dt_softplus=True, state_batch_indices=live, out=y1, backend=args.backend,
        )  # fmt: skip

    err_y = err_s = 0.0
    t_first = None
    for _ in range(steps):
        x1.copy_(randn(batch, H, P))
        z1.copy_(randn(batch, H, P))
        dt1.copy_(randn(batch, H, dtype=torch.float32, scale=0.5))
        B1.copy_(randn(batch, G, N))
        C1.copy_(randn(batch, G, N))
        _, t = _timed(lambda: decode(pool), device)
        t_first = t if t_first is None else t_first
        want = torch.stack([ref.step(states[b], x1[b], dt1[b], B1[b], C1[b], z1[b]) for b in range(batch)])
        err_y = max(err_y, rel_err(y1, want))
        err_s = max(err_s, rel_err(pool[live.long()], states))
    if steps:
        scratch = pool.clone()
        t_steady = _steady(lambda: decode(scratch), device, reps) if reps else None
        timings.append(("selective_state_update (1 token)", t_first, t_steady))
        checks.append(Check("decode y", err_y, tol))
        checks.append(Check("decode states", err_s, tol))
        for c in checks[-2:]:
            print(f"      {c.what:<24} max err {c.err:.2e} (tol {c.tol:.0e})", flush=True)

    # ---- 3. one MTP step: T_mtp tokens per sequence, packed, with accepted-token counts
    acc = [(2 * b) % T_mtp + 1 for b in range(batch)]
    print(
        f"[3/4] MTP: {T_mtp} tokens per sequence, packed, through selective_state_update (num_accepted_tokens {acc})",
        flush=True,
    )
    rows = batch * T_mtp
    junk = torch.arange(1 + batch, 1 + batch + rows, dtype=torch.int32, device=device).view(batch, T_mtp)
    src = junk.clone()
    for b in range(batch):  # the accepted token's state sits at column acc - 1; the others hold unrelated states
        src[b, acc[b] - 1] = live[b]
    dst = torch.arange(1 + batch + rows, S, dtype=torch.int32, device=device).view(batch, T_mtp)
    xm, zm = randn(rows, H, P), randn(rows, H, P)
    dtm = randn(rows, H, dtype=torch.float32, scale=0.5)
    Bm, Cm = randn(rows, G, N), randn(rows, G, N)
    ym = torch.empty_like(xm)
    cu_m = torch.arange(0, rows + 1, T_mtp, dtype=torch.int32, device=device)
    acc_t = i32(acc)

    def mtp(pool_):
        return selective_state_update(
            pool_, xm, dtm.unsqueeze(-1).expand(rows, H, P), A_t, Bm, Cm, D_t, z=zm, dt_bias=bias_t,
            dt_softplus=True, state_batch_indices=src, dst_state_batch_indices=dst, out=ym,
            cu_seqlens=cu_m, num_accepted_tokens=acc_t, backend=args.backend,
        )  # fmt: skip

    untouched = pool[: 1 + batch + rows].clone()  # slot 0, the live read slots and the other src entries
    _, t_first = _timed(lambda: mtp(pool), device)
    ym_want = torch.empty(rows, H, P, dtype=torch.float64, device=device)
    st_want = torch.empty(rows, H, P, N, dtype=torch.float64, device=device)
    for b in range(batch):
        for t in range(T_mtp):
            r = b * T_mtp + t
            ym_want[r] = ref.step(states[b], xm[r], dtm[r], Bm[r], Cm[r], zm[r])
            st_want[r] = states[b]
    checks.append(Check("MTP y", rel_err(ym, ym_want), tol))
    checks.append(Check("MTP per-token states", rel_err(pool[dst.view(-1).long()], st_want), tol))
    same = torch.equal(pool[: 1 + batch + rows], untouched)
    checks.append(Check("MTP read slots untouched", 0.0 if same else 1.0, 0.0))
    scratch = pool.clone()
    t_steady = _steady(lambda: mtp(scratch), device, reps) if reps else None
    timings.append((f"selective_state_update (MTP {T_mtp})", t_first, t_steady))
    for c in checks[-3:]:
        print(f"      {c.what:<24} max err {c.err:.2e} (tol {c.tol:.0e})", flush=True)

    # ---- 4. report
    print(
        "[4/4] time per eager call, synchronised (validation + launch included; the first call compiles on a GPU)"
        + (f": first, then the median of {reps}" if reps else ": first"),
        flush=True,
    )
    for what, first, steady in timings:
        tail = f"   steady {_fmt_time(steady)}" if steady is not None else ""
        print(f"      {what:<36} first {_fmt_time(first)}{tail}", flush=True)
    failed = [c for c in checks if not c.ok]
    worst = max(checks, key=lambda c: c.err if c.err == c.err else float("inf"))
    if failed:
        print(f"FAIL: {', '.join(c.what for c in failed)} above tolerance", flush=True)
        return 1
    print(f"PASS: {len(checks)} checks, worst {worst.what} {worst.err:.2e} (tol {tol:.0e})", flush=True)
    return 0


# ---------------------------------------------------------------------------------------- passthrough
