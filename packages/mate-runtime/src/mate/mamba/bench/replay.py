"""``mate-mamba bench replay``: the ReplaySSM decode (``replay_state_update``) against FlashInfer 0.7.2's
``checkpointing_ssu`` and MATE's own stored-state decode (``selective_state_update``), in one run.

The grid: the registry's per-rank shapes of Nemotron-H 8B at TP1 and Nemotron 3 Super at TP8
(``shapes.SSD_CASES``), batch 1 / 8 / 64 / 256 / 1024, 1 / 2 / 4 / 6 tokens per step (one-token decode and MTP),
fp32 / bf16 / int8 states (int8 block-scaled: an fp32 scale per (slot, head, dim) row, FlashInfer's layout).

The ring is vLLM 0.33's: a logical window ``W`` of 16 (``--replayssm-buffer-len``'s default), ``L = W + T`` rows.
Inputs are the forms vLLM passes (dt bf16 with stride 0 over P, A ``[H, P, N]`` of strides ``(1, 0, 0)``, D and
dt_bias bf16 ``[H, P]`` of strides ``(1, 0)``, softplus, no z, int32 slots). Each call runs over its own window of
slots (``mate.mamba.bench.timing``: CUDA-graph replay, working set larger than L2). A graph replay does not move the
trackers, so each slot's live count ``pnat`` fixes what every replay of it does:

- ``cycle``: the live counts spread evenly over a ring cycle (one token per call: ``1..W``, the one at ``W``
  flushing; MTP: ``0..W``), so a call's sequences sit at every phase, as in a served batch, and its time is the
  average step of a cycle, flushes included;
- ``replay``: a step with no flush (``pnat`` over ``0..W - T``);
- ``flush``: a step where every sequence flushes (``pnat = W``).

``replay`` and ``flush`` are measured at batch 64 (:data:`PHASE_BATCH`).

FlashInfer compiles a JIT module per (shape, state, T) on its first call (minutes each), and MATE a kernel per
configuration: before the timing ``--prebuild-jobs`` worker processes (default 8) call every implementation once
per configuration the cells use, in parallel, which fills FlashInfer's JIT cache and MATE's kernel cache;
``--prebuild-only`` stops there (a call of its own on a machine whose caches persist).

The stored-state column is ``mate-mamba bench ssu``'s call on a pool of the same format (MTP: every token's state
written to its own slot), timed per ring cycle like the replay. ``bytes`` counts what a replay step must move: the
state (and an int8 state's scales) read once, the flushed states written, the live ring rows read, the new tokens'
rows appended; TB/s is that over the time. The issue's targets (:data:`TARGETS`) compare the stored-state decode
with the replay at batch 64 and above.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import torch
from mate.mamba._contract.dtypes import STATE_FORMATS
from mate.mamba.bench import arglists
from mate.mamba.bench.report import markdown_table, plot, write_report
from mate.mamba.bench.shapes import SSD_CASES, SSUShape
from mate.mamba.bench.timing import graph_times_us, start, windows_for

WINDOW = 16  # vLLM 0.33's replayssm_buffer_len default (FlashInfer's largest window)
DT_NAME = {dt: f.label for dt, f in STATE_FORMATS.items()}
BY_NAME = {v: k for k, v in DT_NAME.items()}
PHASES = ("cycle", "replay", "flush")
IMPLS = ("mate", "flashinfer", "mate-stored")
# the registry's per-rank shapes of the targets: Nemotron-H 8B at TP1, Nemotron 3 Super at TP8 (16 heads, 1 group)
MODELS = ("nemotron-h-8b-tp1", "nemotron-3-super-120b-tp8")
STATES = ("fp32", "bf16", "int8")
TOKENS = (1, 2, 4, 6)
BATCHES = (1, 8, 64, 256, 1024)
PHASE_BATCH = 64  # the batch at which the no-flush and all-flush steps are measured apart
QUICK = dict(models=MODELS[:1], states=("bf16", "fp32"), tokens=(1, 6), batches=(1, 64))
# issue #44's targets: stored-state time / replay time at batch >= TARGET_BATCH, by tokens per step
TARGETS = {1: 1.3, 6: 2.0}
TARGET_BATCH = 64


def shape_of(name: str) -> SSUShape:
    c = SSD_CASES[name]
    return SSUShape(name, c.heads, c.dim, c.dstate, c.groups)


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

    @property
    def config(self) -> tuple[str, str, int]:
        """What a compiled kernel (FlashInfer's JIT module, MATE's spec) depends on: (shape, state, T)."""
        return self.shape.name, DT_NAME[self.state], self.T


def build_plan(args) -> list[Case]:
    """The cells an argument namespace of :func:`build_parser` measures, in order; nothing runs."""
    grid = dict(models=MODELS, states=STATES, tokens=TOKENS, batches=BATCHES)
    pick = {k: getattr(args, k) or (QUICK[k] if args.quick else default) for k, default in grid.items()}
    out = []
    for name in pick["models"]:
        shape = shape_of(name)
        for state in pick["states"]:
            for T in pick["tokens"]:
                cells = [Case(shape, BY_NAME[state], b, T) for b in pick["batches"]]
                if PHASE_BATCH in pick["batches"]:
                    cells += [Case(shape, BY_NAME[state], PHASE_BATCH, T, p) for p in PHASES[1:]]
                out += [c for c in cells if c.phase in args.phases]
    return out


def configs(plan: list[Case]) -> list[tuple[str, str, int]]:
    """The distinct (shape, state, T) of ``plan``: one FlashInfer JIT module and one set of MATE kernels each."""
    return list(dict.fromkeys(c.config for c in plan))


def serving_configs() -> list[dict]:
    """The ``replay_plan.serving_specs`` arguments of the full grid's kernels (``tools/gpu/precompile.py``)."""
    full = build_plan(build_parser().parse_args([]))
    out = []
    for name, state, T in configs(full):
        s = shape_of(name)
        out.append(dict(state_dtype=BY_NAME[state], io_dtype=torch.bfloat16, heads=s.heads, dim=s.dim, dstate=s.dstate,
                        groups=s.groups, slot_dtype=torch.int32, window=WINDOW, tokens=T))  # fmt: skip
    return out


def live_counts(case: Case, n: int, dev) -> torch.Tensor:
    W, T = WINDOW, case.T
    i = torch.arange(n, device=dev, dtype=torch.int32)
    if case.phase == "flush":
        return torch.full((n,), W, device=dev, dtype=torch.int32)
    if case.phase == "replay":
        return i % (W - T + 1)
    return 1 + i % W if T == 1 else i % (W + 1)


def slot_bytes(case: Case) -> int:
    """One slot's state in memory: the numbers, and a block-scaled state's fp32 scale per (head, dim) row."""
    s, fmt = case.shape, STATE_FORMATS[case.state]
    return s.heads * s.dim * (s.dstate * case.state.itemsize + (4 if fmt.block_scaled else 0))


def moved_bytes(case: Case) -> tuple[float, int]:
    """(bytes one replay call moves on average over its live counts, bytes one stored-state call moves): the
    module docstring's count."""
    s, T = case.shape, case.T
    pnat = live_counts(case, WINDOW * (WINDOW + 1), "cpu").float()  # a whole cycle of live counts
    flush = (pnat + T > WINDOW).float()
    ring_row = s.heads * s.dim * 2 + s.groups * s.dstate * 2 + s.heads * 4  # x, B (bf16) and dt' (fp32) of a token
    per_seq = slot_bytes(case) * (1 + flush) + (pnat + T) * ring_row
    stored = slot_bytes(case) * (2 if T == 1 else 1 + T)
    return case.batch * float(per_seq.mean()), case.batch * stored


def _pool(S: int, case: Case, dev) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A state pool of ``S`` slots in the case's format, with its scales where block-scaled."""
    s, fmt = case.shape, STATE_FORMATS[case.state]
    shape = (S, s.heads, s.dim, s.dstate)
    if not fmt.block_scaled:
        return torch.empty(shape, device=dev, dtype=case.state).normal_(0, 0.5), None
    q = torch.randint(-int(fmt.qmax), int(fmt.qmax) + 1, shape, device=dev, dtype=torch.int16).to(case.state)
    return q, torch.rand(S, s.heads, s.dim, device=dev) * (1.0 / fmt.qmax) + 1e-4


class Window:
    """One call's inputs over its own slots (``batch`` consecutive slots of the pools)."""

    def __init__(self, case: Case, first: int, dev):
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
    def __init__(self, case: Case, dev, stored: bool, windows: int | None = None):
        s, T, L = case.shape, case.T, case.ring
        H, P, N, G = s.heads, s.dim, s.dstate, s.groups
        self.bytes_per_call, self.stored_bytes = moved_bytes(case)
        self.windows_n = windows or windows_for(int(self.bytes_per_call + (self.stored_bytes if stored else 0)))
        S = self.windows_n * case.batch
        self.state, self.scale = _pool(S, case, dev)
        self.x_cache = torch.randn(S, H, L, P, device=dev).to(torch.bfloat16)
        self.B_cache = torch.randn(S, G, L, N, device=dev).to(torch.bfloat16)
        self.dt_cache = torch.rand(S, H, L, device=dev) * 0.1
        self.ring_start = torch.randint(0, L, (S,), device=dev, dtype=torch.int32)
        self.pnat = live_counts(case, S, dev)  # slot i at phase i % cycle: window w holds slots w * batch + ...
        self.stored, self.stored_scale = _pool(S * T, case, dev) if stored else (None, None)
        self.A = (-(torch.rand(H, device=dev) + 0.5)).view(H, 1, 1).expand(H, P, N)
        self.D = torch.randn(H, device=dev).to(torch.bfloat16).unsqueeze(1).expand(H, P)
        self.dt_bias = (torch.randn(H, device=dev) * 0.3).to(torch.bfloat16).unsqueeze(1).expand(H, P)
        self.windows = [Window(case, w * case.batch, dev) for w in range(self.windows_n)]
        self.case = case

    def ring_tensors(self) -> list[torch.Tensor]:
        """What a replay call writes, slot first: the pool (and its scales) and the rings."""
        return [t for t in (self.state, self.scale, self.x_cache, self.B_cache, self.dt_cache) if t is not None]


def _mate(st: Setup, w: Window):
    from mate.mamba import replay_state_update

    return replay_state_update(
        st.state, st.x_cache, st.B_cache, st.dt_cache, st.ring_start, st.pnat, w.x, w.dt, st.A, w.B, w.C, w.out,
        D=st.D, dt_bias=st.dt_bias, dt_softplus=True, state_batch_indices=w.slots, pad_slot_id=-1,
        state_scale=st.scale, backend="tilelang",
    )  # fmt: skip


def _mate_stored(st: Setup, w: Window):
    from mate.mamba import selective_state_update

    return selective_state_update(
        st.stored, w.s_x, w.s_dt, st.A, w.s_B, w.s_C, st.D, dt_bias=st.dt_bias, dt_softplus=True,
        state_batch_indices=w.s_src, out=w.s_out, cu_seqlens=w.s_cu, num_accepted_tokens=w.s_acc,
        state_scale=st.stored_scale, backend="tilelang",
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
            state_scale=st.scale, cb_scaled=cb, cumAdt_vec=cum, cb_old=old,
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


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[-1] if text else ''}"[:300]


def _y_err(st: Setup, impls: dict) -> tuple[dict, dict]:
    """Each implementation once on window 0 (the replays from the same pool): ({replay impl: max |y - y_mate| /
    max |y_mate|}, {impl: why it failed})."""
    w = st.windows[0]
    rows = w.slots.long()
    saved = [t[rows].clone() for t in st.ring_tensors()]  # window 0's slots only: the pools may be most of memory

    def restore():
        for t, v in zip(st.ring_tensors(), saved, strict=True):
            t[rows] = v

    ys, failed = {}, {}
    for name, fn in impls.items():
        restore()
        try:
            fn(st, w)
            if w.out.is_cuda:  # a kernel's fault surfaces here, named by its implementation
                torch.cuda.synchronize()
            if name != "mate-stored":
                ys[name] = w.out.float().clone()
        except Exception as exc:
            failed[name] = _short(exc)
    restore()
    ref = ys.get("mate")
    errs = {}
    if ref is not None:
        for name, y in ys.items():
            errs[name] = float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
    return errs, failed


# ------------------------------------------------------------------------------------------- prebuild


def build_config(shape: str, state: str, T: int, names: list[str]) -> int:
    """Every implementation of ``names`` once at batch 1 of one configuration (FlashInfer's JIT build, MATE's
    kernel compiles into its disk cache), in a worker process; 1 if one failed."""
    impls, skipped = load_impls(names)
    st = Setup(Case(shape_of(shape), BY_NAME[state], 1, T), torch.device("cuda"), "mate-stored" in impls, windows=1)
    _, failed = _y_err(st, impls)
    for name, why in {**skipped, **failed}.items():
        print(f"{name}: {why}", file=sys.stderr)
    return 1 if failed else 0


def prebuild(cfgs: list[tuple[str, str, int]], names: list[str], jobs: int) -> None:
    """Build the kernels of ``cfgs`` in ``jobs`` worker processes at a time (a failure is reported: the timed
    run then builds, or reports, that configuration itself)."""
    import subprocess
    import time

    t0, pending, running = time.perf_counter(), list(cfgs), []
    while pending or running:
        while pending and len(running) < jobs:
            cfg = pending.pop(0)
            cmd = [sys.executable, "-m", "mate.mamba.bench.replay", "--impls", ",".join(names), "--build-config",
                   *map(str, cfg)]  # fmt: skip
            running.append((cfg, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        cfg, proc = running.pop(0)
        err = proc.communicate()[1]
        status = "built" if proc.returncode == 0 else f"failed ({err.strip().splitlines()[-1:]})"
        print(f"[prebuild] {' '.join(map(str, cfg))}: {status} ({time.perf_counter() - t0:.0f}s)", flush=True)


# ------------------------------------------------------------------------------------------------ runner


def measure(case: Case, impls: dict, dev, replays: int, repeats: int) -> list[dict]:
    """The raw rows of one cell (one per implementation)."""
    use = {n: f for n, f in impls.items() if n != "mate-stored" or case.phase == "cycle"}
    st = Setup(case, dev, stored="mate-stored" in use)
    errs, failed = _y_err(st, use)
    ok = {n: f for n, f in use.items() if n not in failed}
    graphs = {n: [lambda w=w, f=f, st=st: f(st, w) for w in st.windows] for n, f in ok.items()}
    times = graph_times_us(graphs, replays=replays, repeats=repeats)
    s = case.shape
    rows = []
    for name in use:
        row = dict(op=case.op, T=case.T, shape=s.name, heads=s.heads, dim=s.dim, dstate=s.dstate,
                   groups=s.groups, state=DT_NAME[case.state], batch=case.batch, phase=case.phase, impl=name,
                   ring=case.ring)  # fmt: skip
        us = times.get(name)
        if name in failed or isinstance(us, Exception):
            row["error"] = failed.get(name) or _short(us)
        else:
            nbytes = st.stored_bytes if name == "mate-stored" else st.bytes_per_call
            row.update(us=us, tbps=nbytes / (us * 1e-6) / 1e12, y_err=errs.get(name))
        rows.append(row)
        print(f"{case.op:9s} {s.name:26s} {row['state']:4s} b={case.batch:5d} {case.phase:6s} {name:11s} "
              + (f"{row['us']:9.2f} us {row['tbps']:.2f} TB/s" if "us" in row else row["error"]),
              flush=True)  # fmt: skip
    del st, graphs
    torch.cuda.empty_cache()
    return rows


def target_of(op_T: int, batch: int) -> float | None:
    """Issue #44's stored / replay target of a cell (:data:`TARGETS`), None where it sets none."""
    return TARGETS.get(op_T) if batch >= TARGET_BATCH else None


def pivot(rows: list[dict]) -> list[dict]:
    """One line per cell: µs (TB/s) per implementation, FlashInfer / MATE and stored / MATE (> 1: MATE's replay
    is faster), and the stored-state target where issue #44 sets one (met or missed)."""
    out = {}
    for r in rows:
        key = (r["op"], r["shape"], r["state"], r["batch"], r["phase"])
        line = out.setdefault(key, dict(op=r["op"], shape=r["shape"], state=r["state"], batch=r["batch"],
                                        phase=r["phase"], _T=r.get("T")))  # fmt: skip
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
        goal = target_of(line["_T"], line["batch"]) if line["phase"] == "cycle" else None
        if goal is not None and "stored / MATE" in line:
            line["target"] = f">= {goal}: {'met' if line['stored / MATE'] >= goal else 'missed'}"
    return [{k: v for k, v in line.items() if not k.startswith("_")} for line in out.values()]


# ------------------------------------------------------------------------------------------ command line

COLUMNS = ["op", "shape", "state", "batch", "phase", *IMPLS, "flashinfer / MATE", "stored / MATE", "target"]


def list_lines(plan: list[Case]) -> list[str]:
    """One line per cell (shape, state, tokens, batch, phase, ring, bytes per call), then the build count."""
    lines = []
    for c in plan:
        s = c.shape
        replay, stored = moved_bytes(c)
        lines.append(f"{s.name} H{s.heads} P{s.dim} N{s.dstate} G{s.groups} {DT_NAME[c.state]} {c.op} "
                     f"batch={c.batch} {c.phase} ring={c.ring} replay {replay / 1e6:.2f} MB, stored "
                     f"{stored / 1e6:.2f} MB")  # fmt: skip
    lines.append(f"{len(plan)} cells; {len(configs(plan))} configurations to build (shape, state, T)")
    return lines


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(dict.fromkeys(int(v) for v in text.split(",") if v.strip()))
    except ValueError:
        vals = ()
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, e.g. 1,64; got {text!r}")
    return vals


def _tokens(text: str) -> tuple[int, ...]:
    vals = _ints(text)
    if max(vals) > WINDOW:
        raise argparse.ArgumentTypeError(f"expected tokens per step of 1..{WINDOW} (the window must hold a step's "
                                         f"tokens); got {text!r}")  # fmt: skip
    return vals


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mate-mamba bench replay", description=__doc__.split("\n\n")[0])
    arglists.add_report(ap, "replay")
    arglists.add_impls(ap, IMPLS)
    ap.add_argument(
        "--quick", action="store_true",
        help=f"{QUICK['models'][0]}, {'/'.join(QUICK['states'])} states, tokens {'/'.join(map(str, QUICK['tokens']))}, "
        f"batches {'/'.join(map(str, QUICK['batches']))} (the options below override each)",
    )  # fmt: skip
    ap.add_argument(
        "--models", type=lambda v: arglists.names(v, MODELS, "per-rank cases"), default=None, metavar="LIST",
        help=f"comma list of the registry's per-rank cases, of {', '.join(MODELS)} (default: both)",
    )  # fmt: skip
    ap.add_argument(
        "--state", dest="states", type=lambda v: arglists.names(v, STATES, "state formats"), default=None,
        metavar="LIST", help=f"comma list of state formats, of {', '.join(STATES)} (default: all)",
    )  # fmt: skip
    ap.add_argument(
        "--tokens", type=_tokens, default=None, metavar="LIST",
        help=f"comma list of tokens per step (default: {','.join(map(str, TOKENS))}; 1 is one-token decode)",
    )  # fmt: skip
    ap.add_argument(
        "--batches", type=_ints, default=None, metavar="LIST",
        help=f"comma list of batch sizes (default: {','.join(map(str, BATCHES))}; the replay and flush steps are "
        f"measured where {PHASE_BATCH} is one)",
    )  # fmt: skip
    ap.add_argument(
        "--phases", type=lambda v: arglists.names(v, PHASES, "phases"), default=list(PHASES), metavar="LIST",
        help="comma list of the steps timed, of cycle (the ring-cycle average), replay (no flush), flush (every "
        "sequence flushing) (default: all)",
    )  # fmt: skip
    ap.add_argument("--list", action="store_true", help="print the cells the options select, and exit (no device)")
    arglists.add_timing(ap, replays=20)
    ap.add_argument(
        "--prebuild-jobs", type=int, default=8, metavar="N",
        help="worker processes building FlashInfer's JIT modules and MATE's kernels before the timing (default: "
        "%(default)s; 0: each on its first call)",
    )  # fmt: skip
    ap.add_argument("--prebuild-only", action="store_true", help="build the selected cells' kernels and exit")
    ap.add_argument("--build-config", nargs=3, metavar=("SHAPE", "STATE", "T"), help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # bad names exit 2 with one line, before any device is needed
    if args.build_config:  # a prebuild worker
        shape, state, T = args.build_config
        return build_config(shape, state, int(T), args.impls)
    if args.prebuild_jobs < 0:
        print(f"mate-mamba bench replay: --prebuild-jobs: expected >= 0, got {args.prebuild_jobs}", file=sys.stderr)
        return 2
    plan = build_plan(args)
    code = arglists.listed_or_refused("mate-mamba bench replay", plan, list_lines, args.list,
                                      "--models, --state, --tokens, --batches, --phases, --quick")  # fmt: skip
    if code is not None:
        return code
    if args.prebuild_only or args.prebuild_jobs > 0:
        prebuild(configs(plan), args.impls, max(1, args.prebuild_jobs))
        if args.prebuild_only:
            return 0
    impls, skipped = load_impls(args.impls)
    dev, ceiling = start(skipped)
    meta = dict(
        device=torch.cuda.get_device_name(dev), torch=torch.__version__, copy_ceiling_tbps=ceiling, skipped=skipped,
        replays=args.replays, repeats=args.repeats, window=WINDOW, targets={str(k): v for k, v in TARGETS.items()},
        target_batch=TARGET_BATCH,
        method="CUDA-graph replay over disjoint slot windows (working set > L2), median of repeats, implementations "
        "timed in interleaved rounds",
    )  # fmt: skip
    rows: list[dict] = []
    cols = [c for c in COLUMNS if c not in IMPLS or c in args.impls]
    preface = (
        f"# replay_state_update on {meta['device']}\n\nµs per call (TB/s of the bytes a replay step moves; the "
        f"stored column: its state read + written); {meta['method']}. Copy ceiling in the same run: {ceiling:.2f} "
        f"TB/s. Window {WINDOW}, ring {WINDOW} + T rows. `x / MATE` > 1: MATE's replay is faster. `target`: issue "
        f"#44's stored / MATE at batch >= {TARGET_BATCH} ({', '.join(f'T={k}: {v}x' for k, v in TARGETS.items())}).\n"
    )
    if skipped:
        preface += "\nSkipped: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()) + "\n"

    def report() -> dict:
        return write_report(args.name, pivot(rows), args.out, meta=dict(meta, raw=rows), columns=cols,
                            preface=preface)  # fmt: skip

    for case in plan:
        try:
            rows += measure(case, impls, dev, args.replays, args.repeats)
        except Exception as exc:  # one cell failing (e.g. out of memory) is reported, the rest measured
            print(f"{case.op} {case.shape.name} {DT_NAME[case.state]} b={case.batch} {case.phase}: {_short(exc)}",
                  flush=True)  # fmt: skip
            torch.cuda.empty_cache()
        report()  # partial results survive a time limit
    paths = report()
    png = plot([r for r in rows if r.get("us") is not None and r["phase"] == "cycle"],
               os.path.join(args.out, f"{args.name}.png"), x="batch", y="us", series="impl",
               panel=("op", "shape", "state"), title="replay_state_update, µs per call (ring cycle)")  # fmt: skip
    print(markdown_table(pivot(rows), cols))
    print("wrote", ", ".join(paths.values()), png or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["BATCHES", "IMPLS", "MODELS", "PHASES", "QUICK", "STATES", "TARGETS", "TOKENS", "Case", "build_parser",
           "build_plan", "configs", "list_lines", "main", "moved_bytes", "pivot", "serving_configs"]  # fmt: skip
