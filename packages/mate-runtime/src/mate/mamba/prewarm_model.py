"""``mate-mamba prewarm``: compile every SSU and SSD kernel that serving one model configuration will use.

Reads a Hugging Face style ``config.json`` (Mamba2, Nemotron-H / Nemotron 3, Falcon-H1, Bamba / Zamba2 style
field names), derives the per-rank heads and groups for ``--tp``, and compiles the one-token and packed
(MTP) ``selective_state_update`` kernels and the SSD prefill kernels, printing a line per kernel and a
summary. Modes:

- default: compile for the local GPU into MATE's kernel cache (``MATE_CACHE_DIR``, docs/startup.md), so a server
  started afterwards loads each kernel in a few ms;
- ``--target sm_90a``: compile for that architecture without a GPU (a build machine, CI): the cache directory it
  writes is what a GPU host of that architecture loads with no compile;
- ``--dry-run``: list the kernels only.

Kernels already in the cache are loaded, the others compiled in ``--jobs`` worker processes (default: the cores
available); ``--verbose`` prints where each compile's time went (factory build, lowering, code generation, nvcc,
host wrapper, cache writes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}  # fmt: skip

# (field names tried in order) per quantity
FIELDS = {
    "heads": ("mamba_num_heads", "mamba_n_heads", "num_heads", "n_mamba_heads", "ssm_num_heads"),
    "dim": ("mamba_head_dim", "mamba_d_head", "head_dim", "mamba_headdim", "ssm_head_dim"),
    "dstate": ("ssm_state_size", "mamba_d_state", "state_size", "d_state", "mamba_state_size"),
    "groups": ("n_groups", "mamba_n_groups", "mamba_ngroups", "ngroups"),
    "chunk_size": ("chunk_size", "mamba_chunk_size", "ssm_chunk_size"),
}


@dataclass(frozen=True)
class ModelSSM:
    model_type: str
    heads: int  # whole model
    dim: int
    dstate: int
    groups: int
    chunk_size: int


# The CUDA architectures the kernels run on (wgmma and TMA: Hopper), for --target and the local GPU.
KERNEL_ARCHS = ("sm_90a",)


def _first(cfg: dict, names, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def _field(path: str, cfg: dict, names, default=None, *, number=int):
    """The first of the fields ``names`` present in ``cfg``, checked to be a positive number (``number`` int:
    an integer; float: any number), else ``default``. Raises ValueError naming the file and the field."""
    for n in names:
        v = cfg.get(n)
        if v is None:
            continue
        ok = isinstance(v, int | float) and not isinstance(v, bool) and v > 0
        if number is int and isinstance(v, float):
            ok = ok and v.is_integer()
        if not ok:
            kind = "a positive integer" if number is int else "a positive number"
            raise ValueError(f"{path}: field '{n}': got {v!r}; expected {kind}")
        return number(v)
    return default


def read_config(path: str) -> ModelSSM:
    """The SSM dimensions of a model's ``config.json`` (a nested ``text_config`` / ``llm_config`` is searched
    too). Raises ValueError naming the file and the field (a file that is not a JSON object, a field missing or
    not a positive integer); OSError when the file cannot be read."""
    with open(path) as f:
        text = f.read()
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(cfg, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(cfg), "a number")
        raise ValueError(f"{path}: expected a JSON object (a model's config.json), got {kind}")
    for nested in ("text_config", "llm_config", "language_config"):
        if isinstance(cfg.get(nested), dict) and _first(cfg[nested], FIELDS["dstate"]) is not None:
            cfg = {**cfg, **cfg[nested]}
    mtype = str(cfg.get("model_type", "unknown"))
    dim = _field(path, cfg, FIELDS["dim"], 64 if mtype == "mamba2" else None)
    heads = _field(path, cfg, FIELDS["heads"])
    hidden = _field(path, cfg, ("hidden_size",))
    if heads is None and dim and hidden:
        expand = _field(path, cfg, ("mamba_expand", "expand"), 2, number=float)
        heads = int(expand * hidden) // dim
    dstate = _field(path, cfg, FIELDS["dstate"])
    groups = _field(path, cfg, FIELDS["groups"], 1)
    chunk = _field(path, cfg, FIELDS["chunk_size"], 256)
    for field, v in (("heads", heads), ("dim", dim), ("dstate", dstate)):
        if v is None:
            raise ValueError(f"{path}: no Mamba2 '{field}' field found (tried {', '.join(FIELDS[field])})")
    return ModelSSM(mtype, heads, dim, dstate, groups, chunk)


def check_target(arch: str) -> None:
    """ValueError unless ``arch`` is an architecture the kernels run on (:data:`KERNEL_ARCHS`)."""
    if arch not in KERNEL_ARCHS:
        raise ValueError(
            f"--target: got {arch!r}; expected one of {', '.join(KERNEL_ARCHS)} (the kernels use Hopper's TMA and "
            "wgmma; MATE serves other devices from the reference backend, which needs no compiling)"
        )


def check_tilelang() -> None:
    """ValueError (one line) when TileLang, which compiles the kernels, cannot be imported."""
    import importlib.util

    if importlib.util.find_spec("tilelang") is None:
        raise ValueError("compiling the kernels needs TileLang, not installed here: pip install 'mate-runtime[cuda]'")
    try:
        import tilelang  # noqa: F401
    except Exception as exc:
        raise ValueError(f"TileLang is installed but fails to import: {type(exc).__name__}: {exc}") from None


def check_device(device) -> None:
    """ValueError unless the local accelerator runs the kernels (a CUDA device of compute capability 9.x)."""
    if device.type != "cuda":
        return  # MUSA: tilelang-musa decides
    major, minor = torch.cuda.get_device_capability(device)
    arch = f"sm_{major}{minor}" + ("a" if major == 9 else "")
    if arch not in KERNEL_ARCHS:
        raise ValueError(
            f"{device} is {arch} ({torch.cuda.get_device_name(device)}); the kernels run on {', '.join(KERNEL_ARCHS)} "
            "(there MATE uses the reference backend, which needs no compiling)"
        )


def per_rank(m: ModelSSM, tp: int) -> tuple[int, int]:
    """(heads, groups) on one tensor-parallel rank: heads split evenly; groups split when divisible, a single
    group replicated on every rank (vLLM's rule)."""
    if tp < 1 or m.heads % tp:
        raise ValueError(f"--tp: got {tp}; expected a positive divisor of the model's heads ({m.heads})")
    if m.groups % tp == 0:
        groups = m.groups // tp
    elif m.groups == 1:
        groups = 1
    else:
        raise ValueError(f"--tp: got {tp}; n_groups ({m.groups}) is neither divisible by it nor 1")
    return m.heads // tp, groups


def plan_kernels(m: ModelSSM, *, tp, state_dtype, io_dtype, mtp_tokens, pdl=False):
    """(heads, groups, [(label, spec)]) for one rank of the model; ``pdl``: the SSU kernels' PDL build
    (``mate.mamba._platform.device.pdl_for_capability`` / ``pdl_for_arch`` decide it for the device or target)."""
    from mate.mamba._tilelang import ssd_plan, ssu_plan

    heads, groups = per_rank(m, tp)
    items = []
    for spec in ssu_plan.serving_specs(
        state_dtype=state_dtype, io_dtype=io_dtype, heads=heads, dim=m.dim, dstate=m.dstate, groups=groups,
        slot_dtype=torch.int32, packed=True, meta_dtype=torch.int32, tie_hdim=True, pdl=pdl,
    ):  # fmt: skip
        if spec.one_token:
            kind = "one-token" + (" small grid" if spec.min_blocks == 0 and spec.state_dtype != "float32" else "")
        else:
            kind = f"packed (MTP {mtp_tokens} + 1)" if mtp_tokens else "packed"
        items.append((f"ssu {kind} dt={spec.dt_dtype}", spec))
    for spec in ssd_plan.serving_specs(
        heads=heads, groups=groups, dim=m.dim, dstate=m.dstate, chunk_size=m.chunk_size, io_dtype=io_dtype,
        state_dtype=state_dtype, dt_dtype=torch.float32,
    ):  # fmt: skip
        if spec.factory == "ssd_dt_kernel":
            label = f"ssd dt pre-pass{' (final states into a pool)' if spec.use_final_indices else ''}"
        elif spec.factory == "ssd_run_states_kernel":
            label = "ssd split state pass"
        elif spec.factory == "ssd_combine_kernel":
            label = "ssd split hand-over"
        else:
            label = (f"ssd chunk scan{' split' * spec.split}{' intermediate' if spec.intermediate else ''}"
                     f"{' L2 prefetch' * spec.prefetch}")  # fmt: skip
        items.append((label, spec))
    return heads, groups, items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mate-mamba prewarm",
        description="Compile every SSU and SSD kernel that serving one model configuration uses.",
    )
    ap.add_argument("config", help="a model directory or its config.json")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    ap.add_argument("--state-dtype", default="float32", choices=sorted(DTYPES), help="SSM state cache dtype")
    ap.add_argument(
        "--io-dtype", default="bfloat16", choices=("bfloat16", "bf16", "float16", "fp16"), help="x/B/C/z dtype"
    )
    ap.add_argument("--mtp-tokens", type=int, default=0, help="speculative tokens per step (MTP), 0 for none")
    ap.add_argument("--dry-run", "--list", action="store_true", dest="dry_run", help="list the kernels only")
    ap.add_argument("--target", default=None, help="compile for this CUDA arch without a GPU, e.g. sm_90a")
    ap.add_argument(
        "--jobs", "-j", type=int, default=None,
        help="worker processes compiling the kernels not yet cached (default: the cores available; 1: in this process)",
    )  # fmt: skip
    ap.add_argument("--verbose", "-v", action="store_true", help="print each compile's time per phase")
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    args = ap.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:  # an argument mistake: named before anything is read or checked
        print(f"mate-mamba prewarm: --jobs: got {args.jobs}; expected a positive int", file=sys.stderr)
        return 2

    path = os.path.join(args.config, "config.json") if os.path.isdir(args.config) else args.config
    try:
        model = read_config(path)
        if args.mtp_tokens < 0:
            raise ValueError(f"--mtp-tokens: got {args.mtp_tokens}; expected >= 0")
        from mate.mamba._platform import device as _device

        # the kernels as the target or this machine's accelerator runs them (the SSU kernels' PDL build); an
        # architecture the kernels cannot run on, or a missing TileLang, is refused before anything compiles
        if args.target:
            check_target(args.target)
            device, pdl = None, _device.pdl_for_arch(args.target)
        else:
            device = _device.default_accelerator()
            if device is not None and not args.dry_run:
                check_device(device)
            hw = _device.hardware(device) if device is not None else None
            pdl = _device.pdl_for_capability(hw.kind, hw.major) if hw is not None else False
        heads, groups, items = plan_kernels(
            model, tp=args.tp, state_dtype=DTYPES[args.state_dtype], io_dtype=DTYPES[args.io_dtype],
            mtp_tokens=args.mtp_tokens, pdl=pdl,
        )  # fmt: skip
    except (OSError, ValueError, NotImplementedError) as exc:
        if args.debug:
            raise
        print(f"mate-mamba prewarm: {exc}", file=sys.stderr)
        return 2
    print(
        f"{model.model_type}: heads {model.heads}, head_dim {model.dim}, d_state {model.dstate}, "
        f"n_groups {model.groups}, chunk {model.chunk_size}; tp {args.tp} -> per rank heads {heads}, "
        f"groups {groups}; state {args.state_dtype}, io {args.io_dtype}"
    )
    if args.dry_run:
        for i, (label, _spec) in enumerate(items, 1):
            print(f"[{i}/{len(items)}] {label}")
        print(f"{len(items)} kernels (dry run: nothing compiled)")
        return 0

    from mate.mamba._tilelang.cache import CACHE, default_jobs
    from mate.mamba._tilelang.store import store

    if not args.target and device is None:
        print("mate-mamba prewarm: no GPU here; use --target sm_90a to compile only", file=sys.stderr)
        return 2
    # TileLang is checked (and imported) before anything compiles; its import is timed apart from the prewarm
    # work (the cache key names its version)
    t_import = time.perf_counter()
    try:
        check_tilelang()
    except ValueError as exc:
        if args.debug:
            raise
        print(f"mate-mamba prewarm: {exc}", file=sys.stderr)
        return 2
    t_import = time.perf_counter() - t_import
    if args.target:
        target = {"kind": "cuda", "arch": args.target}
    else:
        from mate.mamba._platform.device import tilelang_target

        target = tilelang_target(device)
    st = store()
    if args.verbose:
        from mate.mamba._tilelang.store import versions

        print(f"kernel cache {st.base if st else 'off (MATE_CACHE_DIR=off)'}; key versions {versions(target)}")
    return _prewarm(items, device=device, target=target, jobs=args.jobs or default_jobs(), verbose=args.verbose,
                    where=f"target {args.target}" if args.target else str(device), cache=CACHE,
                    t_import=t_import)  # fmt: skip


def _prewarm(items, *, device, target, jobs, verbose, where, cache, t_import=0.0) -> int:
    """Make every kernel of ``items`` ready: cached ones are loaded here, the others compiled in ``jobs`` worker
    processes (which store them) and then loaded; with one job, or one kernel to compile, in this process."""
    from mate.mamba._tilelang.cache import compile_missing, format_phases

    def ready(spec):
        if device is None:
            return cache.compile_only(spec, spec.build, target=target, pass_configs=spec.pass_configs())
        return cache.get(spec, spec.build, device, prewarm_hint="mate-mamba prewarm", pass_configs=spec.pass_configs())

    t_all = time.perf_counter()
    worker: dict = {}
    labels = {spec: label for label, spec in items}
    compile_missing(list(labels), target=target, jobs=jobs, results=worker, name=labels.get,
                    log=lambda m: print(m, flush=True))  # fmt: skip
    failed, compiled, loaded, from_tilelang, totals = 0, 0, 0, 0, {}
    for i, (label, spec) in enumerate(items, 1):
        t0 = time.perf_counter()
        n_log = len(cache.log)
        try:
            ready(spec)
        except Exception as exc:  # report each, fail at the end
            failed += 1
            err = worker.get(spec, (0, None))[1] or f"{type(exc).__name__}: {exc}"
            print(f"[{i}/{len(items)}] {label} FAILED: {err}", flush=True)
            continue
        here = cache.log[n_log:]
        if spec in worker:  # compiled (or loaded) by a worker, then loaded here
            seconds, _err, source, phases = worker[spec]
        elif here:
            seconds, source, phases = here[-1].seconds, here[-1].source, here[-1].phases
        else:  # already in this process's memory
            seconds, source, phases = time.perf_counter() - t0, "memory", {}
        compiled += source == "compile"
        from_tilelang += source == "tilelang-cache"
        loaded += source in ("disk", "memory")
        for k, v in phases.items():
            totals[k] = totals.get(k, 0.0) + v
        how = {"compile": "compiled", "disk": "loaded from the cache", "memory": "already loaded",
               "tilelang-cache": "built, then loaded from TileLang's cache"}[source]  # fmt: skip
        detail = f": {format_phases(phases)}" if verbose and phases else ""
        print(f"[{i}/{len(items)}] {label} ok {seconds:.2f}s ({how}{detail})", flush=True)
        if verbose:
            print(f"    {spec}", flush=True)
    total = time.perf_counter() - t_all
    print(f"{len(items) - failed}/{len(items)} kernels ready in {total:.2f}s ({where}): {compiled} compiled, "
          f"{loaded} loaded from the cache, {from_tilelang} from TileLang's cache (TileLang import {t_import:.1f}s "
          "before)")  # fmt: skip
    if verbose and totals:
        print(f"compile time by phase (summed over kernels): {format_phases(totals)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
