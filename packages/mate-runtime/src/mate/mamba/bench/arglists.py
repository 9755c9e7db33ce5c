"""Command-line lists of the benchmarks: a comma list of known names, checked as argparse parses it."""

from __future__ import annotations

import argparse


def names(text: str, known, what: str) -> list[str]:
    """A comma list of names of ``known`` (duplicates dropped, order kept); argparse.ArgumentTypeError naming the
    choices otherwise."""
    chosen = [n.strip() for n in text.split(",") if n.strip()]
    if not chosen or any(n not in known for n in chosen):
        raise argparse.ArgumentTypeError(f"expected a comma list of {what} of {', '.join(known)}; got {text!r}")
    return list(dict.fromkeys(chosen))


def add_report(ap: argparse.ArgumentParser, name: str) -> None:
    """``--out`` and ``--name``: where a benchmark writes NAME.json / NAME.md (/ NAME.png)."""
    ap.add_argument(
        "--out", default="bench-results", metavar="DIR",
        help="directory the report is written to (default: %(default)s)",
    )  # fmt: skip
    ap.add_argument("--name", default=name, help="file name of the report, without suffix (default: %(default)s)")


def add_impls(ap: argparse.ArgumentParser, known, default=None, note: str = "") -> None:
    """``--impls``: a comma list of the implementations ``known`` (default: all of them, or ``default``)."""
    default = list(default or known)
    ap.add_argument(
        "--impls", type=lambda v: names(v, known, "implementations"), default=default, metavar="LIST",
        help=f"comma list of the implementations to time, of {', '.join(known)} (default: {','.join(default)}{note})",
    )  # fmt: skip


def add_timing(ap: argparse.ArgumentParser, replays: int, repeats: int = 5) -> None:
    """``--replays`` (graph replays per timed sample) and ``--repeats`` (samples; the median is reported)."""
    ap.add_argument(
        "--replays", type=int, default=replays, metavar="N",
        help="graph replays per timed sample (default: %(default)s)",
    )  # fmt: skip
    ap.add_argument(
        "--repeats", type=int, default=repeats, metavar="N",
        help="timed samples per implementation and case; the median is reported (default: %(default)s)",
    )  # fmt: skip


def listed_or_refused(prog: str, cells: list, lines, listing: bool, options: str, what: str = "cell") -> int | None:
    """The exit status of a benchmark before its device work, or None to go on: 2 (a line on stderr) when the
    options select no ``what`` or no CUDA device is there, 0 after printing ``lines(cells)`` for ``--list``."""
    import sys

    import torch

    if not cells:
        print(f"{prog}: the options select no {what} (see {options})", file=sys.stderr)
        return 2
    if listing:
        print("\n".join(lines(cells)))
        return 0
    if not torch.cuda.is_available():
        print(f"{prog}: needs a CUDA device (--list prints the {what}s without one)", file=sys.stderr)
        return 2
    return None
