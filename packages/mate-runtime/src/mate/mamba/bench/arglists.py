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
