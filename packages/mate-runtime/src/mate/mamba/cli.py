"""The ``mate`` command line.

- ``mate-mamba --version``: the MATE version.
- ``mate-mamba info``: versions (MATE, torch, TileLang), the device, which backends are usable, the kernel cache, and
  every setting (``mate.mamba.settings``) with its value in force.
- ``mate-mamba demo``: one Mamba2 layer's worth of work on a Nemotron-like shape (prefill of a ragged batch through
  ``ssd_combined_fwd_varlen``, decode steps and one MTP step through ``selective_state_update``), checked
  against the float64 token-by-token recurrence of ``mate.mamba.testing`` (``mate.mamba.demo``).
- ``mate-mamba bench ssu|ssd|replay|norm|conv1d|layer [args]``: the benchmark harness (``mate.mamba.bench.ssu`` /
  ``ssd`` / ``replay`` / ``norm`` / ``conv1d`` / ``layer``).
- ``mate-mamba prewarm [args]``: compile the kernels a model configuration needs (``mate.mamba.prewarm_model``).
- ``mate-mamba cache list|verify|clear|export FILE|import FILE``: MATE's compiled-kernel cache (``MATE_CACHE_DIR``).

A user's mistake (a bad option value, a file that cannot be read, a capability the device lacks) ends in one
line on stderr and exit status 2; ``mate-mamba --debug COMMAND ...`` shows the traceback instead.

Heavy imports (torch work, TileLang, the benchmark modules) happen inside the subcommands.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
import textwrap

from mate.mamba.demo import DTYPES, UsageError

# (distribution, import name) of MATE's own packages; `mate-mamba info` lists the installed adapters after them.
DISTRIBUTIONS = (
    ("mate-kernels", "mate_kernels"),
    ("mate-runtime", "mate.mamba"),
)

# Commands whose arguments belong to another module's own parser: (module, what it does).
PASSTHROUGH = {
    ("bench", "ssu"): ("mate.mamba.bench.ssu", "benchmark selective_state_update"),
    ("bench", "ssd"): ("mate.mamba.bench.ssd", "benchmark ssd_combined_fwd_varlen"),
    ("bench", "replay"): ("mate.mamba.bench.replay", "benchmark replay_state_update"),
    ("bench", "norm"): ("mate.mamba.bench.norm", "benchmark rms_norm_gated"),
    ("bench", "conv1d"): ("mate.mamba.bench.conv1d", "benchmark causal_conv1d_update / causal_conv1d_fn"),
    ("bench", "layer"): ("mate.mamba.bench.layer", "benchmark mamba2_decode_step (a layer's fused decode step)"),
    ("prewarm",): ("mate.mamba.prewarm_model", "compile the kernels of a model configuration before serving"),
}


# ----------------------------------------------------------------------------------------------- info


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_line(dist: str, module: str | None) -> str:
    version = _dist_version(dist)
    spec = importlib.util.find_spec(module) if module else None
    if version is not None:
        return f"{version}" + (f" ({spec.submodule_search_locations[0]})" if spec and spec.origin else "")
    if spec is not None:
        return f"not installed as a distribution; importable from {spec.submodule_search_locations[0]}"
    return "not installed"


def tilelang_status() -> tuple[str | None, str]:
    """(version or None, a one-line description). Imports TileLang, so only `mate-mamba info` calls this."""
    if importlib.util.find_spec("tilelang") is None:
        return None, "not installed (pip install 'mate-runtime[cuda]'; MUSA: tilelang-musa built from source)"
    try:
        import tilelang
    except Exception as exc:  # a broken install is reported, not raised: `mate-mamba info` is the diagnostic tool
        return None, f"installed but fails to import: {type(exc).__name__}: {exc}"
    version = getattr(tilelang, "__version__", "unknown version")
    return version, f"{version} ({getattr(tilelang, '__file__', '?')})"


def _distributions() -> list[tuple[str, str]]:
    """:data:`DISTRIBUTIONS`, then each installed adapter (entry point group ``mate.mamba.adapters``)."""
    from mate.mamba import settings

    adapters = [(ep.dist.name, ep.module.partition(".")[0]) for ep in settings.adapters()]
    return [*DISTRIBUTIONS, *adapters]


def cmd_info(args: argparse.Namespace) -> int:
    import mate.mamba
    import torch
    from mate.mamba._platform.device import default_accelerator, device_module
    from mate.mamba._tilelang.cache import cache_dir

    rows: list[tuple[str, str]] = [("mate.mamba", f"{mate.mamba.__version__} ({mate.mamba.__path__[0]})")]
    for dist, module in _distributions():
        rows.append((f"  {dist}", _package_line(dist, module)))
    rows.append(("python", f"{platform.python_version()} ({sys.executable})"))
    rows.append(("torch", torch.__version__))
    tl_version, tl_line = tilelang_status()
    rows.append(("tilelang", tl_line))

    device = default_accelerator()
    if device is None:
        rows.append(("device", "cpu (no CUDA or MUSA device visible)"))
    else:
        mod = device_module(device)
        name = mod.get_device_name(device)
        extra = ""
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            extra = f", compute capability {major}.{minor}"
        rows.append(("device", f"{device} {name}{extra}"))

    rows.append(("backend torch", "usable (pure-PyTorch reference, any device)"))
    reasons = []
    if device is None:
        reasons.append("no CUDA or MUSA device")
    if tl_version is None:
        reasons.append("TileLang not importable")
    if reasons:
        rows.append(("backend tilelang", "not usable: " + "; ".join(reasons)))
    else:
        from mate.mamba._platform.device import tilelang_target

        rows.append(("backend tilelang", f"usable on {device} (target {tilelang_target(device)})"))
    rows.append(("backend auto", "tilelang" if not reasons else "torch"))
    rows.append(("kernel cache", _mate_cache_line()))
    rows.append(("tilelang cache", cache_dir()))

    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print()
    print(settings_table())
    return 0


def _mate_cache_line() -> str:
    from mate.mamba import settings

    try:
        root = settings.get("MATE_CACHE_DIR")
    except ValueError as exc:
        return f"invalid ({exc})"
    return f"{root} (MATE_CACHE_DIR; mate-mamba cache list)" if root else "off (MATE_CACHE_DIR=off)"


# ----------------------------------------------------------------------------------------------- cache


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def cmd_cache(args: argparse.Namespace) -> int:
    import time

    from mate.mamba._tilelang.store import store

    st = store()
    if st is None:
        print("mate-mamba cache: MATE_CACHE_DIR=off: there is no kernel cache", file=sys.stderr)
        return 2
    if args.action == "list":
        entries = st.entries()
        print(f"{st.base}: {len(entries)} entries, {sum(e.size for e in entries) / 1e6:.1f} MB")
        for e in entries:
            if e.manifest is None:
                print(f"  {e.name}  unreadable manifest ({e.size / 1e3:.0f} kB)")
                continue
            key = e.manifest.get("key", {})
            v = key.get("versions", {})
            print(f"  {e.name}  {e.size / 1e3:.0f} kB  {_age(time.time() - e.manifest.get('created', 0))} old  "
                  f"{v.get('arch')} mate {v.get('mate')} kernels {v.get('mate_kernels')} tilelang {v.get('tilelang')} "
                  f"cuda {v.get('cuda')}")  # fmt: skip
            print(f"      {key.get('spec')}")
        return 0
    if args.action == "verify":
        results = st.verify()
        bad = [(e, p) for e, p in results if p is not None]
        for e, problem in bad:
            print(f"  {e.name}: {problem}")
        print(f"{st.base}: {len(results) - len(bad)}/{len(results)} entries sound")
        return 1 if bad else 0
    if args.action == "clear":
        print(f"{st.base}: removed {st.clear()} entries")
        return 0
    if args.action == "export":
        n = st.export(args.file)
        print(f"{args.file}: {n} entries from {st.base}")
        return 0
    added, skipped = st.import_(args.file)
    print(f"{st.base}: {added} entries added from {args.file}, {skipped} skipped (already here or unsound)")
    return 0


def settings_table(environ=None) -> str:
    """Every setting of :mod:`mate.mamba.settings` with the value in force and what it does, then any other
    ``MATE_*`` variable of the environment (MATE does not read it: a misspelling, or an option since removed)."""
    from mate.mamba import settings

    environ = os.environ if environ is None else environ
    lines = ["settings (environment variables, read once per process; mate.mamba.settings):"]
    for name, value, text in settings.describe():
        origin = "set" if (environ.get(name) or "").strip() else "default"
        lines.append(f"  {name}={value} ({origin})")
        lines += textwrap.wrap(text, 108, initial_indent="      ", subsequent_indent="      ")
    unknown = sorted(k for k in environ if k.startswith("MATE_") and k not in settings.SETTINGS)
    for name in unknown:
        lines.append(f"  {name}={environ[name]}: not a MATE setting, ignored")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- demo


def _cmd_demo(args: argparse.Namespace) -> int:
    from mate.mamba.demo import cmd_demo  # (torch and the API load only for the demo)

    return cmd_demo(args)


# What a user's mistake raises (reported in one line unless --debug); anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, NotImplementedError, OSError, ModuleNotFoundError)


def run_module_main(module: str, argv: list[str], debug: bool = False) -> int:
    """Import ``module`` lazily and call its ``main(argv)``; a missing module is reported, not a traceback, and so
    is a user's mistake (unless ``debug``)."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            print(f"mate-mamba: {module} is not part of this installation of mate-runtime ({exc})", file=sys.stderr)
        else:
            print(
                f"mate-mamba: {module} needs the module {exc.name!r}, which is not installed ({exc})", file=sys.stderr
            )
        return 1
    try:
        rc = mod.main(argv)
    except USER_ERRORS as exc:
        if debug:
            raise
        print(f"mate-mamba: {exc}", file=sys.stderr)
        return 2
    return int(rc) if isinstance(rc, int) else 0


# ----------------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    from mate.mamba._platform.version import __version__

    p = argparse.ArgumentParser(prog="mate-mamba", description="MATE: Mamba2 state-space kernels in TileLang.")
    p.add_argument(
        "--version", action="version", version=f"mate-mamba {__version__}", help="print the version and exit"
    )
    p.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    info = sub.add_parser(
        "info",
        help="versions, device, usable backends, kernel cache location and the settings in force",
        description="Versions of MATE, torch and TileLang, the device, which backends are usable, the kernel "
        "cache location, and every MATE_* setting with its value and what it does.",
    )
    info.set_defaults(func=cmd_info)

    demo = sub.add_parser(
        "demo",
        help="a Mamba2 layer's prefill + decode + MTP, checked against a token-by-token recurrence",
        description="Prefill a ragged batch through ssd_combined_fwd_varlen, then decode steps and one MTP step "
        "through selective_state_update, on the GPU when one is there (TileLang) and on the reference "
        "backend otherwise; every result is checked against a float64 token-by-token recurrence. Exits 1 when "
        "an error is above tolerance.",
    )
    demo.add_argument("--device", default="auto", help="auto (a CUDA/MUSA device when visible, else cpu), cpu, cuda")
    demo.add_argument(
        "--backend", default="auto", choices=("auto", "tilelang", "torch"),
        help="auto (TileLang kernels where usable, else the PyTorch reference), tilelang, torch (default auto)",
    )  # fmt: skip
    demo.add_argument("--heads", type=int, default=None, help="default 128 on a GPU, 16 on cpu")
    demo.add_argument("--groups", type=int, default=None, help="default 8 on a GPU, 2 on cpu")
    demo.add_argument("--dim", type=int, default=64, help="head dim P (default 64)")
    demo.add_argument("--dstate", type=int, default=128, help="state size N (default 128)")
    demo.add_argument(
        "--chunk-size", type=int, default=128, choices=(16, 32, 64, 128, 256), help="prefill chunk size (default 128)"
    )
    demo.add_argument(
        "--seqlens", default=None, help="prefill lengths, e.g. 137,300,1,64 (default: 137,4000,1,900,3000 on a GPU)"
    )
    demo.add_argument("--decode-steps", type=int, default=4, help="one-token decode steps (default 4)")
    demo.add_argument("--mtp-tokens", type=int, default=6, help="tokens per sequence in the MTP step (default 6)")
    demo.add_argument("--dtype", default="bf16", choices=tuple(DTYPES), help="x/B/C/z dtype (state is fp32)")
    demo.add_argument("--reps", type=int, default=None, help="timed repeats per call (default 20 on a GPU, 3 on cpu)")
    demo.add_argument("--tol", type=float, default=None, help="max error relative to max |want| (3e-2, fp32 5e-3)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    demo.set_defaults(func=_cmd_demo)

    bench = sub.add_parser(
        "bench",
        help="benchmarks: mate-mamba bench ssu|ssd|replay|norm|conv1d|layer [options of mate.mamba.bench.<kernel>]",
    )
    bench.add_argument(
        "kernel", choices=("ssu", "ssd", "replay", "norm", "conv1d", "layer"),
        help="ssu: selective_state_update (decode), ssd: ssd_combined_fwd_varlen (prefill), replay: "
        "replay_state_update (ReplaySSM decode), norm: rms_norm_gated (the gated RMSNorm), conv1d: "
        "causal_conv1d_update / causal_conv1d_fn, layer: mamba2_decode_step; "
        "mate-mamba bench ssu --help lists its options",
    )  # fmt: skip
    sub.add_parser("prewarm", help="compile a model configuration's kernels: mate-mamba prewarm [options]")

    cache = sub.add_parser(
        "cache",
        help="MATE's compiled-kernel cache (MATE_CACHE_DIR): list, verify, clear, export FILE, import FILE",
        description="MATE's compiled-kernel cache (MATE_CACHE_DIR; docs/startup.md). list: every entry (kernel "
        "spec, versions, size, age); verify: check every file against its manifest checksum (exit 1 if any "
        "fails); clear: remove every entry; export FILE: write the sound entries into a tar file (.tar.gz: "
        "compressed); import FILE: add the entries of such a file (each checked first).",
    )
    csub = cache.add_subparsers(dest="action", metavar="ACTION", required=True)
    csub.add_parser("list", help="every entry: kernel spec, versions, size, age")
    csub.add_parser("verify", help="check every entry against its manifest's checksums")
    csub.add_parser("clear", help="remove every entry")
    for name, what in (("export", "write the sound entries into FILE (tar; .tar.gz compressed)"),
                       ("import", "add the entries of FILE (written by mate-mamba cache export)")):  # fmt: skip
        csub.add_parser(name, help=what).add_argument("file", metavar="FILE")
    cache.set_defaults(func=cmd_cache)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = argv[:1] == ["--debug"]
    rest = argv[1:] if debug else argv
    # bench / prewarm hand every remaining argument (``--help`` included) to the module's own parser.
    if rest[:1] == ["prewarm"]:
        return run_module_main(PASSTHROUGH[("prewarm",)][0], rest[1:] + ["--debug"] * debug, debug)
    if rest[:1] == ["bench"] and len(rest) > 1 and rest[1] in ("ssu", "ssd", "replay", "norm", "conv1d", "layer"):
        return run_module_main(PASSTHROUGH[("bench", rest[1])][0], rest[2:], debug)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (UsageError, *USER_ERRORS) as exc:  # a user's mistake: one line, not a traceback
        if args.debug:
            raise
        print(f"mate-mamba {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"mate-mamba {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
