"""Which kernel serves a call of vLLM's ``--use-replayssm`` decode on its FlashInfer backend: MATE's
``replay_state_update`` or FlashInfer's ``checkpointing_ssu``. One rule, held as data in ``replay_rule.json``
beside this module (or the file ``MATE_VLLM_REPLAYSSM_RULE`` names), derived from a ``mate-mamba bench replay``
report by ``python -m mate_vllm.replay_rule REPORT.json --write``, so that the rule follows the measurement.

The rule: a call goes to MATE where a cell of the table names it, by the call's state dtype, tokens per step, head
shape per rank (heads, head dim, state size, groups) and a batch in the cell's range; every other call goes to
FlashInfer. The derivation reads the report's ring-cycle rows (the average step, flushes included): a measured
batch is MATE's where FlashInfer's time over MATE's exceeds ``margin`` (default 1: MATE measured faster); the
batches from one measured batch to the next are MATE's where both ends are, and those from the largest measured
batch up where it is. Below the smallest measured batch, and anything not measured, stays FlashInfer's.

Standard library only: the plugin reads the rule inside vLLM's start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

RULE_FILE = os.path.join(os.path.dirname(__file__), "replay_rule.json")
KERNELS = ("mate", "flashinfer")
KEY = ("state", "tokens", "heads", "dim", "dstate", "groups")  # a cell's key; the batch range beside it


@dataclass(frozen=True)
class Cell:
    state: str  # the state's torch dtype name (float32, bfloat16, int8, ...)
    tokens: int  # tokens per sequence and step (1: one-token decode; more: MTP)
    heads: int
    dim: int
    dstate: int
    groups: int
    first: int  # the batch range, inclusive; last None: no upper bound
    last: int | None

    def holds(self, key: tuple, batch: int) -> bool:
        return key == tuple(getattr(self, k) for k in KEY) and batch >= self.first and (
            self.last is None or batch <= self.last)  # fmt: skip

    def __str__(self) -> str:
        batches = f"batch {self.first}+" if self.last is None else f"batch {self.first}-{self.last}"
        return (f"{self.state} state, {self.tokens} token(s) per step, H{self.heads} P{self.dim} N{self.dstate} "
                f"G{self.groups}, {batches}")  # fmt: skip


@dataclass(frozen=True)
class Rule:
    cells: tuple[Cell, ...]  # where MATE serves
    source: str  # the measurement it was derived from

    def kernel(self, state: str, tokens: int, batch: int, heads: int, dim: int, dstate: int, groups: int) -> str:
        """``"mate"`` or ``"flashinfer"`` for one call."""
        key = (state, tokens, heads, dim, dstate, groups)
        return "mate" if any(c.holds(key, batch) for c in self.cells) else "flashinfer"

    def describe(self) -> str:
        """The rule in one line (what the plugin logs once)."""
        if not self.cells:
            return f"FlashInfer's kernel serves every ReplaySSM call (MATE measured faster nowhere: {self.source})"
        return (f"MATE serves ReplaySSM for {'; '.join(map(str, self.cells))}; FlashInfer's kernel for the rest "
                f"({self.source})")  # fmt: skip


def parse(data: dict, where: str = "the rule") -> Rule:
    """A :class:`Rule` from its JSON form; ``ValueError`` naming the file and the expected form otherwise."""
    form = ('{"source": str, "mate": [{"state": dtype name, "tokens": int, "heads": int, "dim": int, "dstate": '
            'int, "groups": int, "batches": [first, last or null]}, ...]}')  # fmt: skip
    try:
        cells = []
        for c in data["mate"]:
            first, last = c["batches"]
            cell = Cell(str(c["state"]), *(int(c[k]) for k in KEY[1:]), int(first), None if last is None else int(last))
            if cell.first < 1 or (cell.last is not None and cell.last < cell.first):
                raise ValueError(f"batches {c['batches']}")
            cells.append(cell)
        return Rule(tuple(cells), str(data["source"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: expected {form}; got {e!r}") from e


def load(path: str | None = None) -> Rule:
    """The rule in ``path`` (default: :data:`RULE_FILE`)."""
    path = path or RULE_FILE
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: expected a ReplaySSM rule (JSON, python -m mate_vllm.replay_rule); {e}") from e
    return parse(data, path)


# ------------------------------------------------------------------------------------------ derivation


def _raw_rows(report: dict, run: str | None) -> tuple[list[dict], str]:
    """The raw rows of a ``mate-mamba bench replay`` report (``{"meta": {"raw": [...]}}``) or of one run of a runs-of-
    record file (``{run id: {"meta": ..., ...}}``; default: the last), and a line naming where they came from."""
    if "meta" in report:
        meta = report["meta"]
        where = f"mate-mamba bench replay on {meta.get('device', 'an unnamed device')}"
    else:
        if not report:
            raise ValueError("report: expected a bench report or a runs-of-record file; got an empty object")
        run = run or list(report)[-1]
        if run not in report:
            raise ValueError(f"--run: expected one of {', '.join(report)}; got {run!r}")
        rec = report[run]
        meta = rec["meta"]
        card, date, commit = (rec.get(k, "?") for k in ("card", "date", "commit"))
        where = f"run {run} of the runs of record ({card}, {date}, {commit})"
    if "raw" not in meta:
        raise ValueError("report: expected the bench's raw rows under meta.raw (mate-mamba bench replay writes them)")
    return meta["raw"], where


def _state_names() -> dict:
    """The bench's state labels -> torch dtype names (``mate_kernels.formats``)."""
    from mate_kernels.formats import FORMATS

    return {f.label: name for name, f in FORMATS.items()}


# shapes of reports written before the rows carried them (docs/benchmarks/replay.json's earlier runs)
_OLD_SHAPES = {"nemotron-h-8b": (128, 64, 128, 8), "nemotron-h-8b-tp8": (16, 64, 128, 1)}


def _key(row: dict, names: dict) -> tuple:
    T = row.get("T") or (1 if row["op"] == "one-token" else int(row["op"].split()[-1]))
    shape = tuple(row[k] for k in KEY[2:]) if "heads" in row else _OLD_SHAPES[row["shape"]]
    return (names[row["state"]], int(T), *shape)


def derive(report: dict, run: str | None = None, margin: float = 1.0) -> dict:
    """The rule's JSON form from a bench report (the module docstring's derivation)."""
    rows, where = _raw_rows(report, run)
    names = _state_names()
    times: dict = {}  # (key, batch) -> {impl: us}
    for r in rows:
        if r.get("phase", "cycle") == "cycle" and r.get("us") is not None and r["impl"] in KERNELS:
            times.setdefault((_key(r, names), int(r["batch"])), {})[r["impl"]] = float(r["us"])
    faster: dict = {}  # key -> {batch: MATE faster}
    for (key, batch), t in times.items():
        if len(t) == 2:
            faster.setdefault(key, {})[batch] = t["flashinfer"] / t["mate"] > margin
    cells = []
    for key, by_batch in faster.items():
        bs = sorted(by_batch)
        for i, b in enumerate(bs):
            nxt = bs[i + 1] if i + 1 < len(bs) else None
            if not by_batch[b] or (nxt is not None and not by_batch[nxt]):
                continue
            last = None if nxt is None else nxt - 1
            if cells and cells[-1]["key"] == key and cells[-1]["batches"][1] == b - 1:
                cells[-1]["batches"][1] = last  # adjoining ranges: one cell
            else:
                cells.append(dict(key=key, batches=[b, last]))
    return dict(
        source=f"{where}, FlashInfer / MATE > {margin} per ring cycle",
        mate=[dict(zip(KEY, c["key"], strict=True), batches=c["batches"]) for c in cells],
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mate_vllm.replay_rule", description=(
        "Derive the vLLM adapter's ReplaySSM rule (which calls MATE's kernel serves) from a `mate-mamba bench "
        "replay` report, print it, and with --write store it where the plugin reads it."))  # fmt: skip
    ap.add_argument("report", help="a bench report (NAME.json) or a runs-of-record file (docs/benchmarks/replay.json)")
    ap.add_argument("--run", default=None, help="the run of a runs-of-record file (default: its last)")
    ap.add_argument("--margin", type=float, default=1.0, help="MATE where FlashInfer / MATE exceeds it (default 1)")
    ap.add_argument("--write", nargs="?", const=RULE_FILE, default=None, metavar="PATH",
                    help=f"write the rule there (default PATH: {RULE_FILE})")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        with open(args.report) as f:
            data = derive(json.load(f), args.run, args.margin)
    except (OSError, ValueError, KeyError) as e:
        print(f"python -m mate_vllm.replay_rule: {e}", file=sys.stderr)
        return 2
    text = json.dumps(data, indent=1) + "\n"
    print(parse(data).describe())
    if args.write:
        with open(args.write, "w") as f:
            f.write(text)
        print(f"wrote {args.write}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Cell", "KEY", "RULE_FILE", "Rule", "derive", "load", "main", "parse"]
