"""Benchmark reports: ``<name>.json`` (rows + metadata), ``<name>.md`` (a markdown table) and, when
matplotlib is importable, ``<name>.png`` (one panel per group, a line per implementation)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "(no rows)\n"
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict], path: str, *, x: str, y: str, series: str, panel: Sequence[str], title: str = ""):
    """One subplot per distinct ``panel`` tuple, ``y`` against ``x`` (log x), one line per ``series`` value.
    Returns the path, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    groups = list(dict.fromkeys(tuple(r.get(k) for k in panel) for r in rows if r.get(y) is not None))
    if not groups:
        return None
    ncol = min(3, len(groups))
    nrow = -(-len(groups) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5 * ncol, 3.6 * nrow), squeeze=False)
    for ax, grp in zip(axes.flat, groups, strict=False):
        sel = [r for r in rows if tuple(r.get(k) for k in panel) == grp and r.get(y) is not None]
        for name in dict.fromkeys(r[series] for r in sel):
            pts = sorted((r[x], r[y]) for r in sel if r[series] == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=str(name))
        ax.set_xscale("log", base=2)
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(", ".join(f"{k}={v}" for k, v in zip(panel, grp, strict=True)), fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(
    name: str,
    rows: Sequence[dict],
    out_dir: str,
    *,
    meta: dict | None = None,
    columns: Sequence[str] | None = None,
    preface: str = "",
    plot_spec: dict | None = None,
) -> dict:
    """Write ``<out_dir>/<name>.{json,md[,png]}``; returns the paths written.

    ``plot_spec``: keyword arguments of :func:`plot` (``x``, ``y``, ``series``, ``panel``, ``title``)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    paths["json"] = os.path.join(out_dir, f"{name}.json")
    with open(paths["json"], "w") as f:
        json.dump({"meta": meta or {}, "rows": list(rows)}, f, indent=1, default=str)
    paths["md"] = os.path.join(out_dir, f"{name}.md")
    with open(paths["md"], "w") as f:
        if preface:
            f.write(preface.rstrip() + "\n\n")
        f.write(markdown_table(rows, columns))
    if plot_spec:
        png = plot(rows, os.path.join(out_dir, f"{name}.png"), **plot_spec)
        if png:
            paths["png"] = png
    return paths


__all__ = ["markdown_table", "plot", "write_report"]
