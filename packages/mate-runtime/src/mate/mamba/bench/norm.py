"""``mate-mamba bench norm``: rms_norm_gated (the gated RMSNorm after a Mamba2 mixer's SSM), MATE against vLLM 0.33's
gated norms in one run.

The shapes are the registry's served models per tensor-parallel rank (``shapes.SSD_CASES``): ``hidden = heads * P``
and ``group_size = hidden / groups`` per rank, at 1 to 8192 tokens per call. Every implementation gets the same
tensors in the engine's form: ``x`` the SSM output (contiguous), ``z`` the gate columns of the in_proj output (a row
view of ``[tokens, 2 hidden + 2 G N + H]``), ``weight`` in x's dtype, no bias, ``norm_before_gate=False``.

Implementations: ``mate`` (the TileLang kernel); ``vllm``, vLLM's ``Mixer2RMSNormGated.forward_cuda`` as the engine
calls it on CUDA, which runs its Triton kernel only for a model of one group at TP 1 and PyTorch code otherwise
(:func:`vllm_path`); ``vllm-triton``, vLLM's ``rms_norm_gated`` (the Triton kernel) called with the group size,
which the engine does not do for several groups; ``vllm-compiled`` (opt-in: a compile per case), the engine's
``forward_native`` under ``torch.compile``, what vLLM runs with its default Inductor compilation (custom ops off).

Each call is timed by CUDA-graph replay over disjoint windows of inputs (``mate.mamba.bench.timing``); bytes moved:
x and z read, out written, weight read. Before timing, each peer's output on the first window is compared with
MATE's (max absolute difference), and MATE's with its own fp32 reference backend.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch
from mate.mamba.bench import arglists
from mate.mamba.bench.report import markdown_table, write_report
from mate.mamba.bench.shapes import SSD_CASES, SSD_MODELS
from mate.mamba.bench.timing import L2_BYTES, graph_times_us, host_times_us, start, windows_for

EPS = 1e-5  # Nemotron-H's rms_norm_eps
TOKENS = (1, 8, 64, 256, 1024, 8192)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# --quick: a model of 8 groups at TP 1 (vLLM: PyTorch), one of 1 group (vLLM: Triton), one of 8 groups at TP 8 (one
# group per rank; vLLM: PyTorch)
QUICK_SHAPES = ("nemotron-h-8b-tp1", "mamba2-2.7b-tp1", "nemotron-3-super-120b-tp8")
QUICK_TOKENS = (1, 64, 1024, 8192)
MAX_WINDOWS = 1024  # a small call's working set: up to 1024 windows (48 MiB at 1 token of hidden 8192 in bf16)
HOST_TOKENS = 64  # eager host time measured for calls of at most this many tokens (the device keeps up)


@dataclass(frozen=True)
class NormShape:
    """One rank's gated norm of a served model at one tensor-parallel size."""

    name: str  # "<model>-tp<tp>", as the SSD cases
    model: str
    tp: int
    hidden: int  # per rank: heads * P
    group_size: int  # hidden / groups per rank
    model_groups: int  # the whole model's groups (vLLM's Mixer2RMSNormGated.n_groups: it picks the engine's path)
    proj_width: int  # the in_proj output's row width per rank (z: its first ``hidden`` columns)


def norm_shapes() -> dict[str, NormShape]:
    """Every per-rank case of the registry, by name. A model of one group at TP > 1 would normalise over the whole
    model's hidden (vLLM all-reduces the sums of squares): not one rank's call, so not a case (the registry has
    none)."""
    groups = {m.name: m.groups for m in SSD_MODELS}
    out = {}
    for c in SSD_CASES.values():
        if groups[c.model] == 1 and c.tp > 1:
            continue
        hidden = c.heads * c.dim
        width = 2 * hidden + 2 * c.groups * c.dstate + c.heads  # z, x, B, C, dt (vLLM's in_proj order)
        out[c.name] = NormShape(c.name, c.model, c.tp, hidden, hidden // c.groups, groups[c.model], width)
    return out


NORM_SHAPES = norm_shapes()


def vllm_path(shape: NormShape) -> str:
    """What vLLM 0.33's ``Mixer2RMSNormGated.forward_cuda`` runs for this shape: its Triton kernel for a model of one
    group at TP 1, else ``forward_native`` (PyTorch: fp32 norm, rounded to x's dtype, times the weight, rounded
    again)."""
    return "triton" if shape.model_groups == 1 and shape.tp == 1 else "pytorch"


@dataclass(frozen=True)
class Case:
    shape: NormShape
    tokens: int
    dtype: str  # a key of DTYPES

    @property
    def bytes_per_call(self) -> int:
        esize = DTYPES[self.dtype].itemsize
        return (3 * self.tokens * self.shape.hidden + self.shape.hidden) * esize  # x, z, out; weight


def cases(quick: bool, models=(), tokens=(), dtypes=("bf16",)) -> list[Case]:
    """The cases an invocation measures, in order: every registry shape (``models``: only those) at every token
    count of :data:`TOKENS` (``tokens``: only those) per dtype; with ``quick`` the quick subset, less what
    ``models`` / ``tokens`` leave out."""
    names = QUICK_SHAPES if quick else tuple(NORM_SHAPES)
    counts = QUICK_TOKENS if quick else TOKENS
    return [
        Case(NORM_SHAPES[n], t, dt)
        for dt in dtypes
        for n in names
        if not models or n in models
        for t in counts
        if not tokens or t in tokens
    ]


def parse_models(text: str) -> list[str]:
    """The ``--models`` list as case names: a case (``<model>-tp<N>``), a model (each of its TP sizes) or ``all``."""
    by_model = {}
    for s in NORM_SHAPES.values():
        by_model.setdefault(s.model, []).append(s.name)
    known = ("all", *by_model, *(n for n in NORM_SHAPES if n not in by_model))
    out = []
    for name in arglists.names(text, known, "models or cases"):
        out += list(NORM_SHAPES) if name == "all" else by_model.get(name, [name])
    return list(dict.fromkeys(out))


def parse_tokens(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(dict.fromkeys(int(t) for t in text.split(",") if t.strip()))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive token counts, e.g. 1,64; got {text!r}")
    return counts


def list_lines(selected: list[Case]) -> list[str]:
    """``--list``: one line per case (no device needed)."""
    lines = []
    for c in selected:
        s = c.shape
        lines.append(
            f"{s.name:28s} {c.dtype} tokens={c.tokens:5d} hidden={s.hidden:5d} group_size={s.group_size:5d} "
            f"groups={s.hidden // s.group_size} vllm={vllm_path(s)} bytes={c.bytes_per_call}"
        )
    return lines


# ------------------------------------------------------------------------------------------ inputs


class Window:
    """The tensors of one call: x, and the gate as a row view of an in_proj output."""

    def __init__(self, case: Case, dev):
        s, dt = case.shape, DTYPES[case.dtype]
        self.x = torch.randn(case.tokens, s.hidden, device=dev, dtype=dt)
        self.z = torch.randn(case.tokens, s.proj_width, device=dev, dtype=dt)[:, : s.hidden]


# ------------------------------------------------------------------------------------------ implementations
# Each is ``bind(case, weight) -> call(window) -> y``: bound once per case (one layer's weight, a few KiB, shared by
# the windows), so a peer builds its module (and compiles) once per case.


def _mate(case: Case, weight: torch.Tensor, backend: str = "tilelang"):
    from mate.mamba import rms_norm_gated

    gs = case.shape.group_size
    return lambda w: rms_norm_gated(w.x, weight, None, z=w.z, eps=EPS, group_size=gs, norm_before_gate=False,
                                    backend=backend)  # fmt: skip


def _mixer_norm(case: Case, weight: torch.Tensor):
    """vLLM 0.33's ``Mixer2RMSNormGated`` of one rank, its attributes set as its ``__init__`` sets them (which needs
    vLLM's tensor-parallel state, absent here)."""
    from vllm.model_executor.layers.mamba.mamba_mixer2 import Mixer2RMSNormGated

    s = case.shape
    norm = Mixer2RMSNormGated.__new__(Mixer2RMSNormGated)
    torch.nn.Module.__init__(norm)
    norm.tp_size, norm.tp_rank = s.tp, 0
    norm.full_hidden_size = s.hidden * s.tp
    norm.group_size = norm.full_hidden_size // s.model_groups
    norm.per_rank_hidden_size = s.hidden
    norm.n_groups = norm.full_hidden_size // norm.group_size
    norm.variance_epsilon, norm.use_rms_norm = EPS, True
    norm.weight = torch.nn.Parameter(weight, requires_grad=False)
    return norm


def _load_vllm():
    import vllm.model_executor.layers.mamba.mamba_mixer2  # noqa: F401  (importable, or the column is skipped)

    def bind(case: Case, weight: torch.Tensor):
        norm = _mixer_norm(case, weight)
        return lambda w: norm.forward_cuda(w.x, w.z)

    return bind


def _load_vllm_triton():
    from vllm.model_executor.layers.mamba.ops.layernorm_gated import rms_norm_gated as fn

    def bind(case: Case, weight: torch.Tensor):
        gs = case.shape.group_size
        return lambda w: fn(w.x, weight, None, z=w.z, eps=EPS, group_size=gs, norm_before_gate=False)

    return bind


def _load_vllm_compiled():
    import vllm.model_executor.layers.mamba.mamba_mixer2  # noqa: F401

    def bind(case: Case, weight: torch.Tensor):
        torch._dynamo.reset()  # one compile per case: earlier cases' count towards no recompile limit
        fn = torch.compile(_mixer_norm(case, weight).forward_native, dynamic=False)
        return lambda w: fn(w.x, w.z)

    return bind


IMPLS = ("mate", "vllm", "vllm-triton", "vllm-compiled")
DEFAULT_IMPLS = ("mate", "vllm", "vllm-triton")
PEERS = IMPLS[1:]
LOADERS = {"vllm": _load_vllm, "vllm-triton": _load_vllm_triton, "vllm-compiled": _load_vllm_compiled}


def load_impls(names: list[str]) -> tuple[dict, dict]:
    """({name: bind}, {name: why skipped}): a peer that cannot be imported is reported, not fatal."""
    impls, skipped = {}, {}
    for name in names:
        try:
            impls[name] = _mate if name == "mate" else LOADERS[name]()
        except Exception as exc:
            skipped[name] = f"{type(exc).__name__}: {exc}"
    return impls, skipped


# ------------------------------------------------------------------------------------------ runner


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[-1] if text else ''}"[:300]


def _diffs(calls: dict, w: Window) -> tuple[dict, dict]:
    """({name: max |y - y_mate|}, {name: error}) on one window; ``mate``'s against MATE's fp32 reference backend
    (the ``reference`` call)."""
    ys, failed = {}, {}
    for name, fn in calls.items():
        try:
            ys[name] = fn(w).float()
        except Exception as exc:  # e.g. a peer without a build for this shape
            failed[name] = _first_line(exc)
    ref = ys.pop("mate", None)
    if ref is None:
        return {}, failed
    diffs = {name: (y - ref).abs().max().item() for name, y in ys.items()}
    diffs["mate"] = diffs.pop("reference", None)
    return diffs, failed


def measure(case: Case, impls: dict, ceiling: float, args, dev) -> list[dict]:
    """One case: every implementation's rows (µs, GB/s, % of the copy ceiling, the difference, the host time)."""
    n = windows_for(case.bytes_per_call, max_windows=MAX_WINDOWS)
    wins = [Window(case, dev) for _ in range(n)]
    weight = (1 + 0.1 * torch.randn(case.shape.hidden, device=dev)).to(DTYPES[case.dtype])
    calls, failed = {}, {}
    for name, bind in {**impls, "reference": lambda c, wt: _mate(c, wt, backend="torch")}.items():
        try:
            calls[name] = bind(case, weight)
        except Exception as exc:
            failed[name] = _first_line(exc)
    diffs, failed_now = _diffs(calls, wins[0])
    failed.update(failed_now)
    ok = {name: calls[name] for name in impls if name not in failed}
    times = graph_times_us(
        {name: [lambda w=w, fn=fn: fn(w) for w in wins] for name, fn in ok.items()},
        replays=args.replays, repeats=args.repeats,
    )  # fmt: skip
    host = {}
    if case.tokens <= HOST_TOKENS:
        timed = [name for name in ok if not isinstance(times[name], Exception)]
        try:
            host = host_times_us({name: (lambda fn=ok[name]: fn(wins[0])) for name in timed})
        except Exception as exc:  # the device times stand; the case reports no host time
            print(f"host time of {case.shape.name} tokens={case.tokens} failed: {_first_line(exc)}", flush=True)
    s = case.shape
    base = dict(
        shape=s.name, dtype=case.dtype, tokens=case.tokens, hidden=s.hidden, group_size=s.group_size,
        groups=s.hidden // s.group_size, vllm_path=vllm_path(s),
        working_set_mb=round(n * case.bytes_per_call / 2**20, 1),
    )  # fmt: skip
    rows = []
    for name in impls:
        row = dict(base, impl=name)
        us = failed.get(name) or times[name]
        if isinstance(us, (str, Exception)):
            row["error"] = us if isinstance(us, str) else _first_line(us)
        else:
            row.update(us=us, gbps=case.bytes_per_call / (us * 1e-6) / 1e9)
            row["pct_ceiling"] = 100 * row["gbps"] / (ceiling * 1e3)
            row["max_abs_diff"] = diffs.get(name)  # mate: against its fp32 reference; a peer: against mate
            if name in host:
                row["host_us"] = host[name]
        rows.append(row)
        print(
            f"{s.name:28s} {case.dtype} tokens={case.tokens:5d} {name:13s} "
            + (f"{row['us']:9.2f} us {row['gbps']:8.1f} GB/s" if "us" in row else row["error"]),
            flush=True,
        )
    return rows


def summary(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """One line per case: µs per implementation, MATE's speed-up over each peer (peer µs / MATE µs), MATE's GB/s and
    % of the copy ceiling, the largest difference from MATE, and the host times."""
    lines: dict = {}
    for r in rows:
        key = (r["shape"], r["dtype"], r["tokens"])
        line = lines.setdefault(key, dict(shape=r["shape"], dtype=r["dtype"], tokens=r["tokens"], vllm=r["vllm_path"]))
        line[f"{r['impl']} µs"] = round(r["us"], 2) if "us" in r else "n/a"
        if r["impl"] == "mate" and "us" in r:
            line["mate GB/s"], line["mate % ceiling"] = round(r["gbps"]), round(r["pct_ceiling"], 1)
            line["mate vs ref"] = r["max_abs_diff"]
        if r.get("host_us") is not None:
            line[f"host {r['impl']} µs"] = round(r["host_us"], 1)
    mates = {(r["shape"], r["dtype"], r["tokens"]): r["us"] for r in rows if r["impl"] == "mate" and "us" in r}
    for r in rows:
        key = (r["shape"], r["dtype"], r["tokens"])
        if r["impl"] in PEERS and "us" in r and key in mates:
            lines[key][f"{r['impl']} / mate"] = round(r["us"] / mates[key], 2)
            diff = lines[key].get("max |peer - mate|")
            lines[key]["max |peer - mate|"] = max(diff or 0.0, r["max_abs_diff"] or 0.0)
    out = list(lines.values())
    cols = list(dict.fromkeys(k for line in out for k in line if not k.startswith("host ")))
    return out, cols + sorted({k for line in out for k in line if k.startswith("host ")})


DESCRIPTION = (
    "Benchmark rms_norm_gated (the gated RMSNorm of a Mamba2 mixer): MATE against vLLM 0.33's norm as the engine "
    "calls it, and its Triton kernel called with the group size, on the registry's per-rank shapes. Timed by "
    "CUDA-graph replay over disjoint windows of inputs. Writes NAME.json and NAME.md under --out. Needs a CUDA device "
    "(except --list); a peer that cannot be imported is skipped and named in the report."
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mate-mamba bench norm", description=DESCRIPTION)
    arglists.add_report(ap, "norm")
    arglists.add_impls(ap, IMPLS, DEFAULT_IMPLS, note="; vllm-compiled compiles once per case")
    ap.add_argument(
        "--quick", action="store_true",
        help=f"only {', '.join(QUICK_SHAPES)} at {','.join(map(str, QUICK_TOKENS))} tokens",
    )  # fmt: skip
    ap.add_argument(
        "--models", type=parse_models, default=[], metavar="LIST",
        help="comma list of per-rank cases (e.g. nemotron-h-8b-tp2), models (each tensor-parallel size the registry "
        "holds) or all (default: every case)",
    )  # fmt: skip
    ap.add_argument(
        "--tokens", type=parse_tokens, default=(), metavar="LIST",
        help=f"comma list of tokens per call: only those (default: {','.join(map(str, TOKENS))})",
    )  # fmt: skip
    ap.add_argument(
        "--dtype", type=lambda v: arglists.names(v, DTYPES, "dtypes"), default=["bf16"], metavar="LIST",
        help="comma list of x / z / weight dtypes, of bf16, fp16 (default: bf16)",
    )  # fmt: skip
    ap.add_argument("--list", action="store_true", help="print the selected cases and exit (no device needed)")
    arglists.add_timing(ap, replays=20)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # bad values exit 2 with one line, before any device is needed
    selected = cases(args.quick, args.models, args.tokens, args.dtype)
    code = arglists.listed_or_refused("mate-mamba bench norm", selected, list_lines, args.list,
                                      "--models, --tokens, --quick", what="case")  # fmt: skip
    if code is not None:
        return code
    impls, skipped = load_impls(args.impls)
    dev, ceiling = start(skipped)
    meta = dict(
        device=torch.cuda.get_device_name(dev), torch=torch.__version__, copy_ceiling_tbps=ceiling, skipped=skipped,
        replays=args.replays, repeats=args.repeats, eps=EPS,
        method=f"CUDA-graph replay over disjoint windows of inputs (up to {MAX_WINDOWS}; working_set_mb per row, L2 "
        f"taken as {L2_BYTES >> 20} MiB), median of repeats, the implementations of a case in interleaved rounds; "
        "bytes: x, z read + out written + weight read; host time (calls of at most "
        f"{HOST_TOKENS} tokens): best of 3 interleaved loops of 200 eager calls",
    )  # fmt: skip
    rows: list[dict] = []

    def report():
        table, cols = summary(rows)
        preface = (
            f"# rms_norm_gated on {meta['device']}\n\n{meta['method']}. Copy ceiling measured in the same run: "
            f"{ceiling:.2f} TB/s. `PEER / mate` > 1 means MATE is faster. x contiguous, z a row view of the in_proj "
            "output, weight in x's dtype, no bias, norm_before_gate=False (the Mamba2 mixer's call). `vllm`: "
            "Mixer2RMSNormGated.forward_cuda (its path per shape: triton or pytorch); `vllm-triton`: its Triton "
            "rms_norm_gated called with group_size. `mate vs ref`: max |MATE - MATE's fp32 reference backend|.\n"
        )
        if skipped:
            preface += "\nSkipped: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()) + "\n"
        return write_report(args.name, table, args.out, meta=dict(meta, raw=rows), columns=cols, preface=preface)

    for case in selected:
        rows += measure(case, impls, ceiling, args, dev)
        report()  # partial results survive a time limit
        torch.cuda.empty_cache()
    paths = report()
    print(markdown_table(*summary(rows)))
    print("wrote", ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "Case", "DTYPES", "IMPLS", "NORM_SHAPES", "NormShape", "QUICK_SHAPES", "TOKENS", "build_parser", "cases",
    "list_lines", "load_impls", "main", "norm_shapes", "parse_models", "parse_tokens", "summary", "vllm_path",
]  # fmt: skip
