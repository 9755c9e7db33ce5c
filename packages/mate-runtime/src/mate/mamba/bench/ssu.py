"""``mate-mamba bench ssu``: selective_state_update, MATE against vLLM 0.33's Triton kernel and FlashInfer 0.7.2 in one
run.

Every implementation gets the same tensors (the production forms: x/B/C as row views of one conv-output
buffer, dt/A/D/dt_bias fp32 tied per head, ``dt_softplus``, no z, int32 slot tables) and is timed by
CUDA-graph replay over disjoint slot windows (``mate.mamba.bench.timing``), so each call reads cold HBM. Bandwidth
counts state bytes only: read once + written once (MTP: read once + written once per token). The copy
ceiling is measured in the same run; peers are skipped when they cannot be imported. Before timing, each
peer's ``y`` on the first window is compared with MATE's (reported as ``y_err``). ``--pdl`` adds MATE's
kernels with programmatic dependent launch as a column of their own.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace

import torch
from mate.mamba._contract.dtypes import QUANT_STATE_DTYPES, SSU_SR_STATE_DTYPES, STATE_FORMATS
from mate.mamba.bench import arglists
from mate.mamba.bench.report import markdown_table, plot, write_report
from mate.mamba.bench.shapes import SSU_SHAPES, SSUShape
from mate.mamba.bench.timing import graph_times_us, host_times_us, start, windows_for

# block-scaled states: the pool comes with fp32 scales [slots, H, P] (FlashInfer 0.7.2's int16 layout)
SCALED_NAMES = tuple(STATE_FORMATS[dt].label for dt in QUANT_STATE_DTYPES)
SR = "+sr"  # the name of a stochastically rounded case: its format's label and this
STATE_NAMES = tuple(
    name
    for dt, f in STATE_FORMATS.items()
    for name in ((f.label, f.label + SR) if dt in SSU_SR_STATE_DTYPES else (f.label,))
)
SR_ROUNDS = 10  # Philox rounds of the stochastic-rounding cases (FlashInfer's and vLLM's default)


@dataclass(frozen=True)
class Case:
    shape: SSUShape
    state: torch.dtype
    batch: int
    T: int = 1  # tokens per sequence: 1 = one-token decode, >1 = packed MTP (cu_seqlens + num_accepted_tokens)
    sr: bool = False  # an fp16 state rounded stochastically (rand_seed, SR_ROUNDS Philox rounds)

    @property
    def state_name(self) -> str:
        return STATE_FORMATS[self.state].label + (SR if self.sr else "")

    @property
    def op(self) -> str:
        return "one-token" if self.T == 1 else f"MTP {self.T}"


def cases(quick: bool) -> list[Case]:
    bf16, f32 = torch.bfloat16, torch.float32
    main = SSU_SHAPES["nemotron-h-8b"]
    out = []
    for st in (bf16, f32):
        for b in (1, 8, 64) if quick else (1, 8, 64, 256, 1024):
            out.append(Case(main, st, b))
    for st, bs in ((bf16, (8, 64) if quick else (8, 64, 256)), (f32, (64,) if quick else (8, 64))):
        for b in bs:
            out.append(Case(main, st, b, T=6))
    for st in QUANT_STATE_DTYPES:  # quantised pools at the headline shape: one token, and MTP 6 at batch 64
        for b in (1, 8, 64) if quick else (1, 8, 64, 256, 1024):
            out.append(Case(main, st, b))
        out.append(Case(main, st, 64, T=6))
    for sr in (False, True):  # fp16 states, rounded to nearest and stochastically
        for b in (1, 8, 64) if quick else (1, 8, 64, 256, 1024):
            out.append(Case(main, torch.float16, b, sr=sr))
        out.append(Case(main, torch.float16, 64, T=6, sr=sr))
    if not quick:
        for name in ("nemotron-h-8b-tp8", "falcon-h1-7b", "p80", "mamba2-2.7b"):
            for b in (1, 64, 256):
                out.append(Case(SSU_SHAPES[name], bf16, b))
        out.append(Case(SSU_SHAPES["falcon-h1-7b"], f32, 64))
    return out


class Window:
    """The inputs of one call over its own slots of the pool."""

    def __init__(self, case: Case, pool: torch.Tensor, first_slot: int, dev):
        s = case.shape
        H, P, N, G, T, b = s.heads, s.dim, s.dstate, s.groups, case.T, case.batch
        rows = b * T
        width = H * P + 2 * G * N
        buf = torch.randn(rows, width, device=dev, dtype=torch.bfloat16)
        self.conv_out = buf  # x, B and C: row views of one buffer, as a conv1d writes them
        self.x = buf[:, : H * P].unflatten(-1, (H, P))
        self.B = buf[:, H * P : H * P + G * N].unflatten(-1, (G, N))
        self.C = buf[:, H * P + G * N :].unflatten(-1, (G, N))
        self.dt = (torch.randn(rows, H, device=dev) * 0.5).unsqueeze(-1).expand(rows, H, P)
        self.out = torch.empty(rows, H, P, device=dev, dtype=torch.bfloat16)
        slots = torch.arange(first_slot, first_slot + b * T, device=dev, dtype=torch.int32)
        self.slots = slots
        if T == 1:
            self.src = slots
            self.cu = None
            self.acc = None
        else:
            self.src = slots.view(b, T)
            self.cu = torch.arange(0, rows + 1, T, device=dev, dtype=torch.int32)
            g = torch.Generator(device="cpu").manual_seed(first_slot)
            self.acc = torch.randint(1, T + 1, (b,), generator=g, dtype=torch.int32).to(dev)
        self.pool = pool


class Setup:
    def __init__(self, case: Case, dev, windows: int | None = None):
        s = case.shape
        H, P, N = s.heads, s.dim, s.dstate
        esize = torch.tensor([], dtype=case.state).element_size()
        fmt = STATE_FORMATS[case.state]
        scaled = fmt.block_scaled
        slot_bytes = H * P * N * esize + (H * P * 4 if scaled else 0)  # a scaled state's fp32 row scales too
        self.bytes_per_call = case.batch * slot_bytes * (2 if case.T == 1 else 1 + case.T)
        self.windows_n = windows or windows_for(self.bytes_per_call)
        slots_per_window = case.batch * case.T
        slots = self.windows_n * slots_per_window
        self.scale = None
        self.seed = torch.tensor([20261203], device=dev) if case.sr else None
        if scaled:  # random rows quantised as the kernels store them (max|row| / qmax scales)
            qmax = fmt.qmax
            self.pool = torch.empty(slots, H, P, N, device=dev, dtype=case.state)
            self.scale = torch.empty(slots, H, P, device=dev)
            for lo in range(0, slots, 256):
                v = torch.randn(min(256, slots - lo), H, P, N, device=dev) * 0.5
                sc = v.abs().amax(-1) / qmax
                q = (v / sc.unsqueeze(-1)).clamp(-qmax, qmax)
                self.pool[lo : lo + len(v)] = (q.round() if fmt.integer else q).to(case.state)
                self.scale[lo : lo + len(v)] = sc
        else:
            self.pool = torch.empty(slots, H, P, N, device=dev, dtype=case.state)
            self.pool.normal_(0, 0.5)
        self.A = (-(torch.rand(H, device=dev) + 0.5)).view(H, 1, 1).expand(H, P, N)
        self.D = torch.randn(H, device=dev).unsqueeze(1).expand(H, P)
        self.dt_bias = (torch.randn(H, device=dev) * 0.3).unsqueeze(1).expand(H, P)
        self.windows = [Window(case, self.pool, w * slots_per_window, dev) for w in range(self.windows_n)]
        self.case = case


# ------------------------------------------------------------------------------------------ implementations


def _mate(st: Setup, w: Window):
    from mate.mamba import selective_state_update

    return selective_state_update(
        w.pool, w.x, w.dt, st.A, w.B, w.C, st.D, dt_bias=st.dt_bias, dt_softplus=True, state_batch_indices=w.src,
        out=w.out, cu_seqlens=w.cu, num_accepted_tokens=w.acc, state_scale=st.scale, rand_seed=st.seed,
        philox_rounds=SR_ROUNDS, backend="tilelang",
    )  # fmt: skip


# The ``--pdl`` column: MATE's kernels built with programmatic dependent launch, beside the ``mate`` column
# (the environment's MATE_SSU_PDL, off by default), under ``mate.mamba.settings.override``. The eager fast path
# replays launch recipes keyed on call metadata, and both columns call with the same tensors, so its memory is
# cleared on entering and leaving the override: each column's calls are planned under its own setting. (Only
# the warm-up and capture calls pay that: a graph replay holds the kernels alone; the column reports no host
# time.)
PDL_IMPL = "mate+pdl"


def _mate_pdl(st: Setup, w: Window):
    from mate.mamba import settings
    from mate.mamba.ssu import clear_fast_path_cache

    clear_fast_path_cache()
    try:
        with settings.override(MATE_SSU_PDL="1"):
            return _mate(st, w)
    finally:
        clear_fast_path_cache()


def _load_vllm():
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update as fn

    def call(st: Setup, w: Window):
        if st.scale is not None:
            raise NotImplementedError("vLLM 0.33's Triton selective_state_update takes no block-scaled state")
        if st.seed is not None:  # its rounding is the cvt.rs.f16x2.f32 instruction
            raise NotImplementedError("vLLM 0.33's stochastic rounding needs cvt.rs (sm_100a and newer), not Hopper")
        fn(
            w.pool, w.x, w.dt, st.A, w.B, w.C, st.D, st.dt_bias, z=None, dt_softplus=True,
            state_batch_indices=w.src, dst_state_batch_indices=w.src, null_block_id=-1, out=w.out,
            num_accepted_tokens=w.acc, cu_seqlens=w.cu,
        )  # fmt: skip
        return w.out

    return call


def _load_flashinfer():
    # FlashInfer's own kernel, from its implementation module: beside mate-flashinfer-compat the package attribute
    # flashinfer.mamba.selective_state_update is MATE's (MATE_FLASHINFER_COMPAT=auto), this one stays FlashInfer's.
    import flashinfer.mamba.selective_state_update  # noqa: F401

    fn = sys.modules["flashinfer.mamba.selective_state_update"].selective_state_update
    if fn.__module__ != "flashinfer.mamba.selective_state_update":  # MATE_FLASHINFER_COMPAT=alias: no FlashInfer
        raise ImportError(f"flashinfer.mamba.selective_state_update is {fn.__module__}'s, not FlashInfer's")

    def call(st: Setup, w: Window):
        T = st.case.T
        return fn(
            w.pool, w.x, w.dt, st.A, w.B, w.C, st.D, z=None, dt_bias=st.dt_bias, dt_softplus=True,
            state_batch_indices=w.src, pad_slot_id=-1, out=w.out, cache_steps=T if T > 1 else 0,
            dst_state_batch_indices=w.src if T > 1 else None, cu_seqlens=w.cu, num_accepted_tokens=w.acc,
            **({} if st.scale is None else {"state_scale": st.scale}),
            **({} if st.seed is None else {"rand_seed": st.seed, "philox_rounds": SR_ROUNDS}),
        )  # fmt: skip

    return call


IMPLS = ("mate", "vllm", "flashinfer")
PEERS = ("vllm", "flashinfer")


def load_impls(names: list[str], pdl: bool = False) -> tuple[dict, dict]:
    """({name: call}, {name: why skipped}); ``pdl``: the ``mate+pdl`` column too, right after ``mate``."""
    impls, skipped = {}, {}
    for name in names:
        try:
            if name == "mate":
                impls[name] = _mate
            elif name == "vllm":
                impls[name] = _load_vllm()
            elif name == "flashinfer":
                impls[name] = _load_flashinfer()
            else:
                raise ValueError(f"unknown implementation {name!r}")
        except Exception as exc:  # a peer that is not importable is reported, not fatal
            skipped[name] = f"{type(exc).__name__}: {exc}"
        if name == "mate" and pdl:
            impls[PDL_IMPL] = _mate_pdl
    return impls, skipped


# ------------------------------------------------------------------------------------------------ runner


def _y_err(st: Setup, impls: dict) -> tuple[dict, dict]:
    """Run every implementation once on window 0 from the same starting state: ({impl: max |y - y_mate| /
    max |y_mate|}, {impl: error message} for implementations that fail on this case)."""
    w = st.windows[0]
    pool = st.pool.view(torch.uint8) if st.pool.element_size() == 1 else st.pool  # (fp8 has no index_put)
    saved = pool[w.slots.long()].clone()
    saved_scale = None if st.scale is None else st.scale[w.slots.long()].clone()
    ys, failed = {}, {}
    for name, fn in impls.items():
        pool[w.slots.long()] = saved
        if saved_scale is not None:
            st.scale[w.slots.long()] = saved_scale
        try:
            ys[name] = fn(st, w).float().clone()
        except Exception as exc:  # e.g. a peer without a build for this shape
            failed[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
    pool[w.slots.long()] = saved
    if saved_scale is not None:
        st.scale[w.slots.long()] = saved_scale
    ref = ys.get("mate")
    if ref is None:
        return {}, failed
    scale = ref.abs().max().item() + 1e-9
    return {n: (y - ref).abs().max().item() / scale for n, y in ys.items() if n != "mate"}, failed


# --after-producer: each call is preceded in the graph by a kernel that rewrites the window's conv buffer in place
# (x, B, C; ``mul_(1)`` keeps the values), the place a conv1d kernel has in a model's decode step. Every
# implementation is then timed as the pair, and the producer alone in the same rounds, so the difference is the
# call's cost where the kernel before it is not a programmatic-launch-aware one (MATE's PDL can hide its own launch
# only behind kernels that trigger early).
PRODUCER = "producer alone"


def _after_producer(w: Window, fn):
    def pair():
        w.conv_out.mul_(1)
        if fn is not None:
            return fn()

    return pair


def selected_cases(quick: bool, state: str | list[str] | None = None, batches: tuple = ()) -> list[Case]:
    """``cases(quick)``, only those of the named state dtypes (:data:`STATE_NAMES`, one or a list) when
    ``state`` is given, only those batch sizes when ``batches`` names some."""
    states = (state,) if isinstance(state, str) else state
    return [c for c in cases(quick) if (not states or c.state_name in states) and (not batches or c.batch in batches)]


def warm_cases(quick: bool, state: str | list[str] | None = None) -> list[Case]:
    """One case per distinct compiled configuration (batch is a runtime dimension everywhere)."""
    return list(dict.fromkeys(replace(c, batch=1) for c in selected_cases(quick, state)))


def warm(args) -> int:
    """Build every implementation's kernels for the selected cases on a one-window setup (fills the peers'
    JIT caches; several of these processes can run in parallel, one per ``--case``)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    impls, _ = load_impls(args.impls, args.pdl)
    sel = warm_cases(args.quick, args.state)
    if args.case is not None:
        if not 0 <= args.case < len(sel):
            print(f"mate-mamba bench ssu: --case: expected 0..{len(sel) - 1}; got {args.case}", file=sys.stderr)
            return 2
        sel = [sel[args.case]]
    for case in sel:
        st = Setup(case, dev, windows=1)
        _, failed = _y_err(st, impls)
        print(f"warm {case.op} {case.shape.name} {case.state_name}: failed={failed}", flush=True)
    return 0


def run(args) -> tuple[list[dict], dict]:
    impls, skipped = load_impls(args.impls, args.pdl)
    dev, ceiling = start(skipped)
    rows = []
    for case in selected_cases(args.quick, args.state, args.batches):
        st = Setup(case, dev)
        errs, failed = _y_err(st, impls)
        ok = {name: fn for name, fn in impls.items() if name not in failed}
        # every implementation of the case timed in interleaved rounds (timing.graph_times_us)
        graphs = {name: [lambda w=w, fn=fn, st=st: fn(st, w) for w in st.windows] for name, fn in ok.items()}
        if args.after_producer:
            for name, fns in graphs.items():
                graphs[name] = [_after_producer(w, f) for w, f in zip(st.windows, fns, strict=True)]
            graphs[PRODUCER] = [_after_producer(w, None) for w in st.windows]
        times = graph_times_us(graphs, replays=args.replays, repeats=args.repeats)
        host = {}
        if case.batch in (1, 8) and case.shape.name == "nemotron-h-8b":
            timed = [n for n in ok if n != PDL_IMPL and not isinstance(times[n], Exception)]
            try:
                host = host_times_us({n: (lambda fn=ok[n], st=st: fn(st, st.windows[0])) for n in timed})
            except Exception as exc:  # the device times stand; the case reports no host time
                print(f"host time of {case.op} b={case.batch} failed: {type(exc).__name__}: {exc}", flush=True)
        for name in list(impls) + ([PRODUCER] if args.after_producer else []):
            row = dict(
                op=case.op, shape=case.shape.name, heads=case.shape.heads, dim=case.shape.dim,
                dstate=case.shape.dstate, groups=case.shape.groups, state=case.state_name, batch=case.batch,
                impl=name,
            )  # fmt: skip
            if name in failed:
                row["error"] = failed[name][:300]
                rows.append(row)
                print(f"{case.op:9s} {case.shape.name:18s} {case.state_name} b={case.batch:5d} {name:10s} failed")
                continue
            us = times[name]
            if isinstance(us, Exception):
                row["error"] = f"{type(us).__name__}: {us}"[:300]
            elif name == PRODUCER:  # no state traffic of its own: its time only
                row.update(us=us, tbps=None)
            else:
                row.update(us=us, tbps=st.bytes_per_call / (us * 1e-6) / 1e12)
                row["pct_ceiling"] = 100 * row["tbps"] / ceiling
                if name in host:
                    row["host_us"] = host[name]
                row["y_err"] = errs.get(name)
            rows.append(row)
            print(
                f"{case.op:9s} {case.shape.name:18s} {case.state_name} b={case.batch:5d} {name:10s} "
                + (f"{row['us']:9.2f} us" if "us" in row else row.get("error", ""))
                + (f" {row['tbps']:.2f} TB/s" if row.get("tbps") is not None else ""),
                flush=True,
            )
        del st
        torch.cuda.empty_cache()
    meta = dict(
        device=torch.cuda.get_device_name(dev), torch=torch.__version__, copy_ceiling_tbps=ceiling,
        skipped=skipped, replays=args.replays, repeats=args.repeats,
        method="CUDA-graph replay over disjoint slot windows (working set > L2), median of repeats, the "
        "implementations of a case timed in interleaved rounds; state bytes read once + written once (MTP: read "
        "once + written once per token); host time: best of 3 interleaved loops of 200 eager calls",
    )  # fmt: skip
    return rows, meta


def pivot(rows: list[dict]) -> list[dict]:
    """One line per case: µs (TB/s) per implementation and the best peer's time over MATE's; a block-scaled
    state's line also the best peer's time with a bf16 and with an fp32 state of the same call over MATE's (the
    bytes the format saves), and a stochastically rounded fp16 line MATE's round-to-nearest fp16 time over its own
    (the rounding's cost), where those cases ran in the same report."""
    out = {}
    best = {}  # (op, shape name, batch, state) -> the best peer's µs
    mates = {(r["op"], r["shape"], r["batch"], r["state"]): r["us"] for r in rows if r["impl"] == "mate" and "us" in r}
    for r in rows:
        key = (r["op"], r["shape"], r["state"], r["batch"])
        line = out.setdefault(
            key, {"op": r["op"], "shape": f"H{r['heads']} P{r['dim']} N{r['dstate']} G{r['groups']}",
                  "state": r["state"], "batch": r["batch"]},
        )  # fmt: skip
        if "us" not in r:
            line[r["impl"]] = "n/a"
        else:
            line[r["impl"]] = f"{r['us']:.2f}" + (f" ({r['tbps']:.2f})" if r["tbps"] is not None else "")
            if r["impl"] in PEERS:
                peer_key = (r["op"], r["shape"], r["batch"], r["state"])
                best[peer_key] = min(best.get(peer_key, r["us"]), r["us"])
        line[f"_{r['impl']}"] = r.get("us")
        if r["impl"] == "mate" and r.get("pct_ceiling") is not None:
            line["MATE % of copy ceiling"] = round(r["pct_ceiling"], 1)
        if r.get("host_us") is not None:
            line[f"host {r['impl']} µs"] = round(r["host_us"], 1)
    res = []
    for (op, name, state, batch), line in out.items():
        mate = line.pop("_mate", None)
        # the peers only: the mate+pdl column and the --after-producer kernel are never the "best peer"
        peers = [line[f"_{p}"] for p in PEERS if line.get(f"_{p}") is not None]
        for k in [k for k in line if k.startswith("_")]:
            line.pop(k)
        line["best peer / MATE"] = round(min(peers) / mate, 2) if mate and peers else None
        if state in SCALED_NAMES and mate:
            for ref in ("bf16", "fp32"):
                peer = best.get((op, name, batch, ref))
                line[f"best {ref} peer / MATE"] = round(peer / mate, 2) if peer else None
        if state.endswith(SR) and mate:  # the cost of the rounding: MATE's own call rounded to nearest
            nearest = state.removesuffix(SR)
            plain = mates.get((op, name, batch, nearest))
            line[f"MATE {nearest} / MATE"] = round(plain / mate, 2) if plain else None
        res.append(line)
    return res


def _batch_list(text: str) -> tuple[int, ...]:
    try:
        batches = tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        batches = ()
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive batch sizes, e.g. 1,8; got {text!r}")
    return batches


DESCRIPTION = (
    "Benchmark selective_state_update: MATE against vLLM 0.33's Triton kernel and FlashInfer 0.7.2 on the same "
    "tensors, timed by CUDA-graph replay over disjoint slot windows (each replay reads cold HBM), the "
    "implementations of a case in interleaved rounds. Writes NAME.json, NAME.md and NAME.png under --out. Needs "
    "a CUDA device; a peer that cannot be imported is skipped and named in the report."
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mate-mamba bench ssu", description=DESCRIPTION)
    arglists.add_report(ap, "ssu")
    arglists.add_impls(ap, IMPLS)
    ap.add_argument(
        "--pdl", action="store_true",
        help="one more MATE column, mate+pdl: the kernels with programmatic dependent launch (run under "
        "MATE_SSU_PDL=1; the mate column keeps the environment's setting)",
    )  # fmt: skip
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the headline shape (Nemotron-H 8B) only: one token at batch 1, 8 and 64, MTP 6 at 8 and 64",
    )
    ap.add_argument(
        "--state", type=lambda v: arglists.names(v, STATE_NAMES, "state formats"), default=None, metavar="LIST",
        help=f"comma list of state formats, of {', '.join(STATE_NAMES)}: only their cases (default: every one; "
        f"{'/'.join(SCALED_NAMES)} are block-scaled)",
    )  # fmt: skip
    ap.add_argument(
        "--batches", type=_batch_list, default=(), metavar="LIST",
        help="comma list of batch sizes, e.g. 1,8: only the cases of those sizes (default: every case)",
    )  # fmt: skip
    ap.add_argument(
        "--after-producer", action="store_true",
        help="time each call after a kernel that rewrites its inputs (the place of a conv1d in a decode step), "
        "and that kernel alone in the same rounds",
    )  # fmt: skip
    arglists.add_timing(ap, replays=20)
    ap.add_argument(
        "--accuracy", type=int, default=None, metavar="STEPS",
        help="instead of timing: the error each state format (MATE's float and block-scaled ones, FlashInfer's "
        "int16 and bf16) adds over STEPS decode steps against the fp32 recurrence (mate.mamba.bench.ssu_accuracy); "
        "writes NAME.{json,md}",
    )  # fmt: skip
    ap.add_argument(
        "--warm-only", action="store_true",
        help="only compile every implementation's kernels for the selected cases (fills the JIT caches) and exit",
    )  # fmt: skip
    ap.add_argument(
        "--case", type=int, default=None, metavar="I",
        help="with --warm-only: only the I-th distinct kernel configuration (one process per case can run in "
        "parallel)",
    )  # fmt: skip
    return ap


def accuracy(args) -> int:
    from mate.mamba.bench import ssu_accuracy

    if args.accuracy < 1:
        print(
            f"mate-mamba bench ssu: --accuracy: expected a positive number of steps; got {args.accuracy}",
            file=sys.stderr,
        )
        return 2
    rows, meta = ssu_accuracy.run(args.accuracy)
    preface = f"# selective_state_update: state formats over {meta['steps']} decode steps on {meta['device']}\n\n"
    preface += f"{meta['method']}\n"
    if meta["skipped"]:
        preface += "\nSkipped: " + "; ".join(f"{k} ({v})" for k, v in meta["skipped"].items()) + "\n"
    paths = write_report(args.name, rows, args.out, meta=meta, columns=ssu_accuracy.COLUMNS, preface=preface)
    print(markdown_table(rows, ssu_accuracy.COLUMNS))
    print("wrote", ", ".join(paths.values()))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # bad values exit 2 with one line, before any device is needed
    if not torch.cuda.is_available():
        print("mate-mamba bench ssu: needs a CUDA device", file=sys.stderr)
        return 2
    if args.warm_only:
        return warm(args)
    if args.accuracy is not None:
        return accuracy(args)
    from mate.mamba import settings

    rows, meta = run(args)
    table = pivot(rows)
    cols = ["op", "shape", "state", "batch", "mate", *([PDL_IMPL] if args.pdl else []), *PEERS]
    cols += [PRODUCER] if args.after_producer else []
    cols += ["best peer / MATE", "MATE % of copy ceiling"]
    cols += [c for c in ("best bf16 peer / MATE", "best fp32 peer / MATE") if any(c in r for r in table)]
    cols += sorted({k for r in table for k in r if k.startswith("host ")})
    pdl_env = settings.get("MATE_SSU_PDL")
    meta["mate_ssu_pdl"] = pdl_env
    preface = (
        f"# selective_state_update on {meta['device']}\n\n"
        f"µs per call (TB/s of state traffic); {meta['method']}. Copy ceiling measured in the same run: "
        f"{meta['copy_ceiling_tbps']:.2f} TB/s. `best peer / MATE` > 1 means MATE is faster. "
        "x bf16 as row views of one conv buffer; dt/A/D/dt_bias fp32 tied per head; dt_softplus; no z. The `mate` "
        f"column under MATE_SSU_PDL={pdl_env} (programmatic dependent launch: 0 off, the default; 1 / auto on)"
        + (f"; `{PDL_IMPL}`: under MATE_SSU_PDL=1.\n" if args.pdl else ".\n")
    )
    if args.after_producer:
        preface += (
            f"\nEach call timed after a kernel that rewrites its window's conv buffer (x, B, C) in place, a conv1d's "
            f"place in a decode step; `{PRODUCER}`: that kernel by itself, timed in the same rounds.\n"
        )
    if meta["skipped"]:
        preface += "\nSkipped: " + "; ".join(f"{k} ({v})" for k, v in meta["skipped"].items()) + "\n"
    meta["raw"] = rows
    paths = write_report(args.name, table, args.out, meta=meta, columns=cols, preface=preface)
    png = plot(
        [r for r in rows if r.get("tbps") is not None],
        os.path.join(args.out, f"{args.name}.png"),
        x="batch", y="tbps", series="impl", panel=("op", "shape", "state"),
        title=f"selective_state_update, TB/s (copy ceiling {meta['copy_ceiling_tbps']:.2f})",
    )  # fmt: skip
    print(markdown_table(table, cols))
    print("wrote", ", ".join(paths.values()), png or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
