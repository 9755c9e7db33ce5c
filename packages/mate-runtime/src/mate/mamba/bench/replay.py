"""``mate-mamba bench replay``: the ReplaySSM decode (``replay_state_update``) against FlashInfer 0.7.2's
``checkpointing_ssu`` and MATE's own stored-state decode (``selective_state_update``), in one run.

The ring is vLLM 0.33's: a logical window ``W`` of 16 (``--replayssm-buffer-len``'s default), ``L = W + T`` rows.
Inputs are the forms vLLM passes (dt bf16 with stride 0 over P, A ``[H, P, N]`` of strides ``(1, 0, 0)``, D and
dt_bias bf16 ``[H, P]`` of strides ``(1, 0)``, softplus, no z, int32 slots). Each call runs over its own window of
slots (``mate.mamba.bench.timing``: CUDA-graph replay, working set larger than L2). A graph replay does not move the
trackers, so each slot's live count ``pnat`` fixes what every replay of it does:

- ``cycle``: the live counts spread evenly over a ring cycle (one token per call: ``1..W``, the one at ``W``
  flushing; MTP: ``0..W``), so a call's sequences sit at every phase, as in a served batch, and its time is the
  average step of a cycle, flushes included;
- ``replay``: no sequence flushes (``pnat`` over ``0..W - T``);
- ``flush``: every sequence flushes (``pnat = W``).

FlashInfer compiles a JIT module per configuration on its first call (about five minutes each on the H200's
host), so before the timing ``--prebuild-jobs`` worker processes (default 8) build the ones the cases use, in
parallel.

The stored-state column is ``mate-mamba bench ssu``'s call on a pool of the same dtype (MTP: every token's state
written to its own slot). ``bytes`` counts what a replay step must move: the state read once, the flushed states
written, the live ring rows read, the new tokens' rows appended; TB/s is that over the time.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import torch
from mate.mamba._contract.dtypes import STATE_FORMATS
from mate.mamba.bench.report import markdown_table, plot, write_report
from mate.mamba.bench.shapes import SSU_SHAPES, SSUShape
from mate.mamba.bench.timing import copy_ceiling_tbps, graph_times_us, windows_for

WINDOW = 16  # vLLM 0.33's replayssm_buffer_len default (FlashInfer's largest window)
DT_NAME = {dt: f.label for dt, f in STATE_FORMATS.items()}
PHASES = ("cycle", "replay", "flush")
IMPLS = ("mate", "flashinfer", "mate-stored")
# the shapes of the targets: Nemotron-H 8B at TP1, and Nemotron 3 Super at TP8 (16 heads, one group per rank)
SHAPES = ("nemotron-h-8b", "nemotron-h-8b-tp8")


@dataclass(frozen=True)
class Case:
    shape: SSUShape
    state: torch.dtype
    batch: int
    T: int = 1
    phase: str = "cycle"

    @property
    def op(self) -> str:
        return "one-token" if self.T == 1 else f"MTP {self.T}"

    @property
    def ring(self) -> int:
        return WINDOW + self.T


def cases(quick: bool) -> list[Case]:
    batches = (1, 64) if quick else (1, 8, 64, 256, 1024)
    out = []
    for name in SHAPES[:1] if quick else SHAPES:
        shape = SSU_SHAPES[name]
        for state in (torch.bfloat16, torch.float32):
            for T in (1, 6):
                out += [Case(shape, state, b, T) for b in batches]
                if name == SHAPES[0]:  # the step kinds apart, at batch 64
                    out += [Case(shape, state, 64, T, phase) for phase in PHASES[1:]]
    return out


def serving_configs() -> list[dict]:
    """The ``replay_plan.serving_specs`` arguments of the benchmark's kernels (``tools/gpu/precompile.py``)."""
    out = []
    for name in SHAPES:
        s = SSU_SHAPES[name]
        for state in (torch.bfloat16, torch.float32):
            for T in (1, 6):
                out.append(
                    dict(
                        state_dtype=state,
                        io_dtype=torch.bfloat16,
                        heads=s.heads,
                        dim=s.dim,
                        dstate=s.dstate,
                        groups=s.groups,
                        slot_dtype=torch.int32,
                        window=WINDOW,
                        tokens=T,
                    )
                )
    return out


def live_counts(case: Case, n: int, dev) -> torch.Tensor:
    W, T = WINDOW, case.T
    i = torch.arange(n, device=dev, dtype=torch.int32)
    if case.phase == "flush":
        return torch.full((n,), W, device=dev, dtype=torch.int32)
    if case.phase == "replay":
        return i % (W - T + 1)
    return 1 + i % W if T == 1 else i % (W + 1)


class Window:
    """One call's inputs over its own slots (``batch`` consecutive slots of the pools)."""

    def __init__(self, case: Case, st: Setup, first: int, dev):
        s, b, T = case.shape, case.batch, case.T
        H, P, N, G = s.heads, s.dim, s.dstate, s.groups
        bf16 = torch.bfloat16
        width = H * P + 2 * G * N  # x, B, C as views of one conv output, as vLLM slices them
        buf = torch.randn(b * T, width, device=dev, dtype=bf16)
        self.x = buf[:, : H * P].view(b, T, H, P)
        self.B = buf[:, H * P : H * P + G * N].view(b, T, G, N)
        self.C = buf[:, H * P + G * N :].view(b, T, G, N)
        self.dt = (torch.randn(b, T, H, device=dev) * 0.5).to(bf16).unsqueeze(-1).expand(b, T, H, P)
        self.out = torch.empty(b, T, H, P, device=dev, dtype=bf16)
        self.slots = torch.arange(first, first + b, device=dev, dtype=torch.int32)
        # the stored-state call: its own pool (every token's state to its own slot at MTP), as mate-mamba bench ssu
        self.s_x, self.s_B, self.s_C = (t.reshape(b * T, *t.shape[2:]) for t in (self.x, self.B, self.C))
        self.s_dt = self.dt.reshape(b * T, H, P)
        self.s_out = self.out.view(b * T, H, P)
        if T == 1:
            self.s_src, self.s_cu, self.s_acc = self.slots, None, None
        else:
            self.s_src = torch.arange(first * T, (first + b) * T, device=dev, dtype=torch.int32).view(b, T)
            self.s_cu = torch.arange(0, b * T + 1, T, device=dev, dtype=torch.int32)
            self.s_acc = torch.full((b,), T, device=dev, dtype=torch.int32)
        self.scratch = None


class Setup:
    def __init__(self, case: Case, dev, stored: bool):
        s, T, L = case.shape, case.T, case.ring
        H, P, N, G = s.heads, s.dim, s.dstate, s.groups
        es = torch.tensor([], dtype=case.state).element_size()
        # the average sequence over a whole cycle of live counts (the windows of a replay cover it)
        pnat = live_counts(case, WINDOW * (WINDOW + 1), "cpu").float()
        flush = (pnat + T > WINDOW).float()
        per_seq = (H * P * N * es) * (1 + flush) + (pnat + T) * (H * P * 2 + G * N * 2 + H * 4)
        self.bytes_per_call = case.batch * float(per_seq.mean())
        self.stored_bytes = case.batch * H * P * N * es * (2 if T == 1 else 1 + T)
        self.windows_n = windows_for(int(self.bytes_per_call + (self.stored_bytes if stored else 0)))
        S = self.windows_n * case.batch
        self.state = torch.empty(S, H, P, N, device=dev, dtype=case.state).normal_(0, 0.5)
        self.x_cache = torch.randn(S, H, L, P, device=dev).to(torch.bfloat16)
        self.B_cache = torch.randn(S, G, L, N, device=dev).to(torch.bfloat16)
        self.dt_cache = torch.rand(S, H, L, device=dev) * 0.1
        self.ring_start = torch.randint(0, L, (S,), device=dev, dtype=torch.int32)
        self.pnat = live_counts(case, S, dev)  # slot i at phase i % cycle: window w holds slots w * batch + ...
        self.stored = None
        if stored:
            self.stored = torch.empty(S * T, H, P, N, device=dev, dtype=case.state).normal_(0, 0.5)
        self.A = (-(torch.rand(H, device=dev) + 0.5)).view(H, 1, 1).expand(H, P, N)
        self.D = torch.randn(H, device=dev).to(torch.bfloat16).unsqueeze(1).expand(H, P)
        self.dt_bias = (torch.randn(H, device=dev) * 0.3).to(torch.bfloat16).unsqueeze(1).expand(H, P)
        self.windows = [Window(case, self, w * case.batch, dev) for w in range(self.windows_n)]
        self.case = case


def _mate(st: Setup, w: Window):
    from mate.mamba import replay_state_update

    return replay_state_update(
        st.state, st.x_cache, st.B_cache, st.dt_cache, st.ring_start, st.pnat, w.x, w.dt, st.A, w.B, w.C, w.out,
        D=st.D, dt_bias=st.dt_bias, dt_softplus=True, state_batch_indices=w.slots, pad_slot_id=-1, backend="tilelang",
    )  # fmt: skip


def _mate_stored(st: Setup, w: Window):
    from mate.mamba import selective_state_update

    return selective_state_update(
        st.stored, w.s_x, w.s_dt, st.A, w.s_B, w.s_C, st.D, dt_bias=st.dt_bias, dt_softplus=True,
        state_batch_indices=w.s_src, out=w.s_out, cu_seqlens=w.s_cu, num_accepted_tokens=w.s_acc, backend="tilelang",
    )  # fmt: skip


def _load_flashinfer():
    # FlashInfer's own op from its implementation module (the package attribute may be MATE's compat surface;
    # ``flashinfer.mamba.checkpointing_ssu`` as an attribute is the function, so the module comes by name)
    import importlib

    fi = importlib.import_module("flashinfer.mamba.checkpointing_ssu")

    if fi.checkpointing_ssu.__module__ != "flashinfer.mamba.checkpointing_ssu":
        raise ImportError(f"flashinfer.mamba.checkpointing_ssu is {fi.checkpointing_ssu.__module__}'s")

    def call(st: Setup, w: Window):
        c = st.case
        if w.scratch is None:  # vLLM passes the scratch trio; 'auto' then takes FlashInfer's heuristic pick
            w.scratch = fi.allocate_checkpointing_ssu_scratch(c.batch, c.shape.heads, c.T, WINDOW, torch.bfloat16,
                                                              w.x.device)  # fmt: skip
        cb, cum, old = w.scratch
        return fi.checkpointing_ssu(
            st.state, st.x_cache, st.B_cache, st.dt_cache, st.ring_start, st.pnat, w.x, w.dt, st.A, w.B, w.C, w.out,
            D=st.D, dt_bias=st.dt_bias, dt_softplus=True, state_batch_indices=w.slots, pad_slot_id=-1,
            cb_scaled=cb, cumAdt_vec=cum, cb_old=old,
        )  # fmt: skip

    return call


def load_impls(names: list[str]) -> tuple[dict, dict]:
    impls, skipped = {}, {}
    for name in names:
        try:
            impls[name] = {"mate": lambda: _mate, "mate-stored": lambda: _mate_stored,
                           "flashinfer": _load_flashinfer}[name]()  # fmt: skip
        except Exception as exc:  # a peer that is not importable is reported, not fatal
            skipped[name] = f"{type(exc).__name__}: {exc}"
    return impls, skipped


def _y_err(st: Setup, impls: dict) -> tuple[dict, dict]:
    """Each replay implementation once on window 0 from the same pool: max |y - y_mate| / max |y_mate|."""
    w = st.windows[0]
    saved = [t.clone() for t in (st.state, st.x_cache, st.B_cache, st.dt_cache)]
    ys, failed = {}, {}
    for name, fn in impls.items():
        if name == "mate-stored":
            continue
        for t, v in zip((st.state, st.x_cache, st.B_cache, st.dt_cache), saved, strict=True):
            t.copy_(v)
        try:
            fn(st, w)
            torch.cuda.synchronize()
            ys[name] = w.out.float().clone()
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
    for t, v in zip((st.state, st.x_cache, st.B_cache, st.dt_cache), saved, strict=True):
        t.copy_(v)
    ref = ys.get("mate")
    errs = {}
    if ref is not None:
        for name, y in ys.items():
            errs[name] = float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
    return errs, failed


def selected(args) -> list[Case]:
    """The cases the command line names."""
    return [
        c for c in cases(args.quick)
        if (not args.batches or c.batch in args.batches) and (not args.states or DT_NAME[c.state] in args.states)
        and (not args.tokens or c.T in args.tokens)
    ]  # fmt: skip


def flashinfer_configs(chosen: list[Case]) -> list[tuple[str, str, int]]:
    """(shape, state, T) of each FlashInfer JIT module the cases use: FlashInfer compiles one per configuration
    on its first call (minutes each on the H200's host), so :func:`prebuild_flashinfer` builds them in parallel."""
    return list(dict.fromkeys((c.shape.name, DT_NAME[c.state], c.T) for c in chosen))


def _build_flashinfer(shape: str, state: str, T: int) -> None:
    """One batch-1 call of FlashInfer's op for one configuration (its JIT build), in a worker process."""
    dtype = {v: k for k, v in DT_NAME.items()}[state]
    st = Setup(Case(SSU_SHAPES[shape], dtype, 1, T), torch.device("cuda"), stored=False)
    _load_flashinfer()(st, st.windows[0])
    torch.cuda.synchronize()


def prebuild_flashinfer(configs: list[tuple[str, str, int]], jobs: int) -> None:
    """Build FlashInfer's JIT modules of ``configs`` in ``jobs`` worker processes at a time (a failure is
    reported: the timed run then builds, or reports, that module itself)."""
    import subprocess
    import time

    t0, pending, running = time.perf_counter(), list(configs), []
    while pending or running:
        while pending and len(running) < jobs:
            cfg = pending.pop(0)
            cmd = [sys.executable, "-m", "mate.mamba.bench.replay", "--build-flashinfer", *map(str, cfg)]
            running.append((cfg, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        cfg, proc = running.pop(0)
        err = proc.communicate()[1]
        status = "built" if proc.returncode == 0 else f"failed ({err.strip().splitlines()[-1:]})"
        print(f"[flashinfer] {' '.join(map(str, cfg))}: {status} ({time.perf_counter() - t0:.0f}s)", flush=True)


def run(args) -> tuple[list[dict], dict]:
    dev = torch.device("cuda", torch.cuda.current_device())
    impls, skipped = load_impls(args.impls)
    for name, why in skipped.items():
        print(f"[skip] {name}: {why}", flush=True)
    chosen = selected(args)
    if "flashinfer" in impls and args.prebuild_jobs > 0:
        prebuild_flashinfer(flashinfer_configs(chosen), args.prebuild_jobs)
    ceiling = copy_ceiling_tbps(dev)
    print(f"copy ceiling: {ceiling:.2f} TB/s (read + write)", flush=True)
    rows = []
    for case in chosen:
        use = {n: f for n, f in impls.items() if n != "mate-stored" or case.phase == "cycle"}
        st = Setup(case, dev, stored="mate-stored" in use)
        errs, failed = _y_err(st, use)
        ok = {n: f for n, f in use.items() if n not in failed}
        graphs = {n: [lambda w=w, f=f, st=st: f(st, w) for w in st.windows] for n, f in ok.items()}
        times = graph_times_us(graphs, replays=args.replays, repeats=args.repeats)
        for name in use:
            row = dict(op=case.op, shape=case.shape.name, state=DT_NAME[case.state], batch=case.batch,
                       phase=case.phase, impl=name, ring=case.ring)  # fmt: skip
            us = times.get(name, None) if name not in failed else None
            if name in failed or isinstance(us, Exception):
                row["error"] = (failed.get(name) or f"{type(us).__name__}: {us}")[:300]
            else:
                nbytes = st.stored_bytes if name == "mate-stored" else st.bytes_per_call
                row.update(us=us, tbps=nbytes / (us * 1e-6) / 1e12, y_err=errs.get(name))
            rows.append(row)
            print(f"{case.op:9s} {case.shape.name:18s} {row['state']} b={case.batch:5d} {case.phase:6s} {name:11s} "
                  + (f"{row['us']:9.2f} us {row['tbps']:.2f} TB/s" if "us" in row else row["error"]),
                  flush=True)  # fmt: skip
        del st
        torch.cuda.empty_cache()
    meta = dict(
        device=torch.cuda.get_device_name(dev), torch=torch.__version__, copy_ceiling_tbps=ceiling, skipped=skipped,
        replays=args.replays, repeats=args.repeats, window=WINDOW,
        method="CUDA-graph replay over disjoint slot windows (working set > L2), median of repeats, implementations "
        "timed in interleaved rounds",
    )  # fmt: skip
    return rows, meta


def pivot(rows: list[dict]) -> list[dict]:
    out = {}
    for r in rows:
        key = (r["op"], r["shape"], r["state"], r["batch"], r["phase"])
        line = out.setdefault(key, dict(op=r["op"], shape=r["shape"], state=r["state"], batch=r["batch"],
                                        phase=r["phase"]))  # fmt: skip
        if "us" in r:
            line[r["impl"]] = f"{r['us']:.2f} ({r['tbps']:.2f})"
            line[f"_{r['impl']}"] = r["us"]
        else:
            line[r["impl"]] = "failed"
    for line in out.values():
        m = line.get("_mate")
        if m:
            for peer, col in (("flashinfer", "flashinfer / MATE"), ("mate-stored", "stored / MATE")):
                if line.get(f"_{peer}"):
                    line[col] = round(line[f"_{peer}"] / m, 3)
    return [{k: v for k, v in line.items() if not k.startswith("_")} for line in out.values()]


def _list(text: str, cast=str) -> tuple:
    try:
        return tuple(cast(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a comma list; got {text!r}") from exc


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mate-mamba bench replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="Nemotron-H 8B only, batches 1 and 64")
    ap.add_argument("--impls", type=lambda t: list(_list(t)), default=list(IMPLS),
                    help=f"comma list of {', '.join(IMPLS)} (default all)")  # fmt: skip
    ap.add_argument("--batches", type=lambda t: _list(t, int), default=(), help="only these batch sizes")
    ap.add_argument("--states", type=lambda t: _list(t), default=(), help="only these state dtypes (bf16, fp32)")
    ap.add_argument("--tokens", type=lambda t: _list(t, int), default=(), help="only these tokens per call (1, 6)")
    ap.add_argument("--replays", type=int, default=20, help="graph replays per timing (default 20)")
    ap.add_argument("--repeats", type=int, default=5, help="timings per implementation (median; default 5)")
    ap.add_argument("--out", default="bench-results", help="report folder (default bench-results)")
    ap.add_argument("--name", default="replay", help="report file name without suffix (default replay)")
    ap.add_argument("--prebuild-jobs", type=int, default=8,
                    help="worker processes building FlashInfer's JIT modules before the timing (default 8; 0: each "
                    "on its first call)")  # fmt: skip
    ap.add_argument("--build-flashinfer", nargs=3, metavar=("SHAPE", "STATE", "T"), help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.build_flashinfer:  # a prebuild worker (prebuild_flashinfer)
        shape, state, T = args.build_flashinfer
        _build_flashinfer(shape, state, int(T))
        return 0
    if args.prebuild_jobs < 0:
        print(f"mate-mamba bench replay: --prebuild-jobs: expected >= 0, got {args.prebuild_jobs}", file=sys.stderr)
        return 2
    bad = [n for n in args.impls if n not in IMPLS]
    if bad:
        print(f"mate-mamba bench replay: --impls: unknown {bad}; expected names of {IMPLS}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("mate-mamba bench replay: needs a CUDA device", file=sys.stderr)
        return 2
    rows, meta = run(args)
    table = pivot(rows)
    cols = ["op", "shape", "state", "batch", "phase", *args.impls, "flashinfer / MATE", "stored / MATE"]
    preface = (
        f"# replay_state_update on {meta['device']}\n\nµs per call (TB/s of the bytes a replay step moves; the "
        f"stored column: its state read + written); {meta['method']}. Copy ceiling in the same run: "
        f"{meta['copy_ceiling_tbps']:.2f} TB/s. Window {WINDOW}, ring {WINDOW} + T rows. `x / MATE` > 1: MATE is "
        "faster.\n"
    )
    if meta["skipped"]:
        preface += "\nSkipped: " + "; ".join(f"{k} ({v})" for k, v in meta["skipped"].items()) + "\n"
    meta["raw"] = rows
    paths = write_report(args.name, table, args.out, meta=meta, columns=cols, preface=preface)
    png = plot([r for r in rows if r.get("us") is not None and r["phase"] == "cycle"],
               os.path.join(args.out, f"{args.name}.png"), x="batch", y="us", series="impl",
               panel=("op", "shape", "state"), title="replay_state_update, µs per call (ring cycle)")  # fmt: skip
    print(markdown_table(table, cols))
    print("wrote", ", ".join(paths.values()), png or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
