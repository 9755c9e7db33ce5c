"""The documentation states what the code does: links resolve, documented limits are the enforced ones, the
examples run, the settings table is complete.

- Every relative link in ``docs/``, ``README.md`` and ``packages/*/README.md`` names an existing file (and, with
  a ``#fragment``, a heading of it).
- ``docs/mamba.md``'s "Enforced limits" table (between ``<!-- enforced-limits:begin -->`` and ``:end -->``) is
  parsed; each row is probed with values inside and outside its accepted set, and a value outside must raise
  the documented error. A row without a probe here fails, so a new documented limit needs a check. Limits only
  a GPU can reach (the TileLang launchers' sequence count) are probed by GPU-marked tests, skipped elsewhere.
- The README's and ``docs/mamba.md``'s Python examples run on the CPU (the reference backend).
- Every variable of ``mate.settings`` is in ``docs/mamba.md``'s settings table with its default listed first.
- No page dates work by an ordinal of the project's own history: measurements carry a
  date and a commit.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
MAMBA_MD = DOCS / "mamba.md"


def doc_files() -> list[Path]:
    return sorted([*DOCS.rglob("*.md"), ROOT / "README.md", *ROOT.glob("packages/*/README.md")])


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def strip_fences(text: str) -> str:
    """The text without fenced code blocks (a ``#`` line in a block is not a heading)."""
    return re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)


def strip_code(text: str) -> str:
    """The text without fenced code blocks and inline code spans (links inside them are not links)."""
    return re.sub(r"`[^`\n]*`", "", strip_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, ``-``, ``_`` and
    spaces kept), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in strip_fences(path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|!\[[^\]]*\]\(\s*([^)\s]+)\s*\)")


def relative_links(path: Path) -> list[str]:
    targets = []
    for m in LINK.finditer(strip_code(path.read_text())):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        targets.append(target)
    return targets


@pytest.mark.parametrize("page", doc_files(), ids=rel)
def test_relative_links_resolve(page):
    broken = []
    for target in relative_links(page):
        file_part, _, fragment = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
            continue
        if fragment and dest.is_file() and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {rel(dest)}")
    assert not broken, f"{rel(page)}: broken links:\n  " + "\n  ".join(broken)


# --- enforced limits ---------------------------------------------------------------------------------------


def documented_limits() -> list[dict]:
    text = MAMBA_MD.read_text()
    m = re.search(r"<!-- enforced-limits:begin -->(.*?)<!-- enforced-limits:end -->", text, re.S)
    assert m, "docs/mamba.md has no enforced-limits table"
    rows = [line.strip() for line in m.group(1).strip().splitlines() if line.strip().startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert header == ["backend", "op", "parameter", "accepted", "outside it"], header
    limits = []
    for line in rows[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        row = dict(zip(["backend", "ops", "parameter", "accepted", "error"], cells, strict=True))
        for op in (o.strip() for o in row.pop("ops").split(",")):
            limits.append({**row, "op": op})
    assert limits, "the enforced-limits table is empty"
    return limits


def accepts(spec: str):
    """A predicate for the table's 'accepted' cell: a comma list, 'multiples of n', 'at most n' or 'powers of two
    from n'."""
    if m := re.fullmatch(r"powers of two from (\d+)", spec):
        k = int(m.group(1))
        return lambda v: v >= k and not v & (v - 1)
    if m := re.fullmatch(r"multiples of (\d+)", spec):
        k = int(m.group(1))
        return lambda v: v % k == 0
    if m := re.fullmatch(r"at most (\d+)", spec):
        k = int(m.group(1))
        return lambda v: v <= k
    names = {s.strip() for s in spec.split(",")}
    return lambda v: (str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else str(v)) in names


ERRORS = {"NotImplementedError": NotImplementedError, "ValueError": ValueError}
FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def ssd_args(io=torch.bfloat16, chunk=64, idx=torch.int32, tokens=6, heads=2, dim=4, dstate=4):
    from mate.mamba.chunking import chunk_metadata

    meta = chunk_metadata([tokens - 2, 2], chunk)
    x = torch.randn(tokens, heads, dim).to(io)
    B = torch.randn(tokens, 1, dstate).to(io)
    tables = [t.to(idx) for t in (meta.cu_seqlens, meta.cu_chunk_seqlens, meta.last_chunk_indices, meta.seq_idx)]
    return (x, torch.rand(tokens, heads), -torch.rand(heads), B, B.clone(), chunk, *tables)


def ssu_args(state=torch.float32, io=torch.bfloat16, idx=torch.int32, batch=2, heads=2, dim=4, dstate=8):
    return dict(
        state=torch.zeros(4, heads, dim, dstate, dtype=state),
        x=torch.randn(batch, heads, dim).to(io),
        dt=torch.rand(batch, heads, dim),
        A=-torch.rand(heads),
        B=torch.randn(batch, 1, dstate).to(io),
        C=torch.randn(batch, 1, dstate).to(io),
        D=None,
        state_batch_indices=torch.tensor([2, 0]).to(idx),
    )


def run_ssd(**kw):
    from mate.mamba import ssd_combined_fwd_varlen

    state_dtype = kw.pop("state_dtype", None)
    return ssd_combined_fwd_varlen(*ssd_args(**kw), state_dtype=state_dtype, backend="torch")


def run_ssu(**kw):
    from mate.mamba import selective_state_update

    return selective_state_update(**ssu_args(**kw), backend="torch")


def tl_check(**kw):
    from mate._tilelang.ssd import _check_supported

    args = dict(dim=64, dstate=128, chunk_size=128, io_dtype=torch.bfloat16) | kw
    _check_supported(args["dim"], args["dstate"], args["chunk_size"], args["io_dtype"])


# (backend, op, parameter) -> (values to probe, call with one value). The accepted values must pass, the
# others raise the documented error. TileLang probes use the planner's shape check, which needs no GPU.
PROBES = {
    ("tilelang", "ssd", "dstate"): ((16, 32, 48, 64, 96, 128, 192, 256, 320, 512), lambda v: tl_check(dstate=v)),
    ("tilelang", "ssd", "dim"): (range(1, 321), lambda v: tl_check(dim=v)),
    ("tilelang", "ssd", "chunk_size"): ((16, 32, 64, 128, 256), lambda v: tl_check(chunk_size=v)),
    ("tilelang", "ssd", "io_dtype"): (FLOATS[:3], lambda v: tl_check(io_dtype=v)),
    ("every", "ssd", "chunk_size"): ((4, 8, 16, 24, 32, 48, 64, 100, 128, 256, 512, 1024), lambda v: run_ssd(chunk=v)),
    ("every", "ssd", "io_dtype"): (FLOATS, lambda v: run_ssd(io=v)),
    ("every", "ssd", "state_dtype"): (FLOATS, lambda v: run_ssd(state_dtype=v)),
    ("every", "ssd", "index_dtype"): ((torch.int32, torch.int64, torch.int16, torch.uint8), lambda v: run_ssd(idx=v)),
    ("every", "ssu", "state_dtype"): (FLOATS, lambda v: run_ssu(state=v)),
    ("every", "ssu", "io_dtype"): (FLOATS, lambda v: run_ssu(io=v)),
    ("every", "ssu", "index_dtype"): ((torch.int32, torch.int64, torch.int16, torch.uint8), lambda v: run_ssu(idx=v)),
}
# Limits that only a GPU launch reaches: checked by the GPU tests below.
GPU_ONLY = {("tilelang", "ssu", "sequences"), ("tilelang", "ssd", "sequences")}


def limit_key(limit: dict) -> tuple[str, str, str]:
    return limit["backend"], limit["op"], limit["parameter"]


def limit_id(limit: dict) -> str:
    return "-".join(limit_key(limit))


@pytest.mark.parametrize("limit", documented_limits(), ids=limit_id)
def test_documented_limit_is_enforced(limit):
    key = limit_key(limit)
    if key in GPU_ONLY:
        pytest.skip("reached only by a TileLang launch on a GPU: test_sequence_limit_on_gpu checks it")
    assert key in PROBES, f"docs/mamba.md documents {key} but test_docs.py has no probe for it: add one"
    error = ERRORS[limit["error"]]
    ok = accepts(limit["accepted"])
    values, call = PROBES[key]
    assert any(ok(v) for v in values) and not all(ok(v) for v in values), f"{key}: probes on one side only"
    for v in values:
        if ok(v):
            call(v)  # documented as accepted: must not raise
        else:
            with pytest.raises(error):
                call(v)


def test_every_gpu_only_limit_is_documented():
    documented = {limit_key(lim) for lim in documented_limits()}
    assert GPU_ONLY <= documented


def test_int16_state_is_not_implemented():
    # the page says so in prose under the table: a valid request MATE does not implement
    with pytest.raises(NotImplementedError):
        run_ssu(state=torch.int16)


def gpu_limit(name: str) -> int:
    row = next(lim for lim in documented_limits() if limit_key(lim) == ("tilelang", name, "sequences"))
    return int(re.fullmatch(r"at most (\d+)", row["accepted"]).group(1))


@pytest.mark.gpu  # skipped without a device or TileLang (tests/conftest.py)
def test_sequence_limit_on_gpu():
    from mate.mamba import selective_state_update, ssd_combined_fwd_varlen
    from mate.mamba.chunking import chunk_metadata

    n = gpu_limit("ssu") + 1
    dev = "cuda"
    with pytest.raises(NotImplementedError):
        selective_state_update(
            torch.zeros(n, 1, 16, 16, device=dev),
            torch.zeros(n, 1, 16, device=dev, dtype=torch.bfloat16),
            torch.zeros(n, 1, 16, device=dev),
            -torch.ones(1, device=dev),
            torch.zeros(n, 1, 16, device=dev, dtype=torch.bfloat16),
            torch.zeros(n, 1, 16, device=dev, dtype=torch.bfloat16),
            None,
            backend="tilelang",
        )
    n = gpu_limit("ssd") + 1
    meta = chunk_metadata([1] * n, 64, device=dev)
    x = torch.zeros(n, 1, 16, device=dev, dtype=torch.bfloat16)
    B = torch.zeros(n, 1, 64, device=dev, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError):
        ssd_combined_fwd_varlen(
            x, torch.zeros(n, 1, device=dev), -torch.ones(1, device=dev), B, B, 64,
            meta.cu_seqlens, meta.cu_chunk_seqlens, meta.last_chunk_indices, meta.seq_idx, backend="tilelang",
        )  # fmt: skip


# --- examples, settings, wording ---------------------------------------------------------------------------


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def test_readme_decode_example_runs_on_cpu():
    blocks = [b for b in python_blocks(ROOT / "README.md") if "selective_state_update(" in b]
    assert blocks, "README.md has no decode example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


@pytest.mark.parametrize("kind", ["selective_state_update(", "ssd_combined_fwd_varlen("])
def test_api_page_examples_run_on_cpu(kind):
    blocks = [b for b in python_blocks(MAMBA_MD) if kind in b and "import torch" in b]
    assert blocks, f"docs/mamba.md has no example calling {kind[:-1]}"
    for block in blocks:
        exec(compile(block, "docs/mamba.md", "exec"), {})


def test_settings_table_lists_every_setting():
    from mate import settings

    text = MAMBA_MD.read_text()
    for name, s in settings.SETTINGS.items():
        m = re.search(rf"^\| `{name}` \| `([^`]*)`", text, re.M)
        assert m, f"docs/mamba.md's settings table has no row for {name}"
        assert m.group(1) == s.default, f"{name}: documented default {m.group(1)!r}, code {s.default!r}"
    documented = set(re.findall(r"^\| `(MATE_[A-Z0-9_]+)` \|", text, re.M))
    extra = documented - set(settings.SETTINGS)
    assert not extra, f"docs/mamba.md documents settings the code does not read: {sorted(extra)}"


ORDINAL = re.compile(
    r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|\d+(st|nd|rd|th))"
    r"[ -]session",
    re.I,
)


@pytest.mark.parametrize("page", doc_files(), ids=rel)
def test_no_ordinal_history_wording(page):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(page.read_text().splitlines(), 1) if ORDINAL.search(line)]
    assert not hits, f"{rel(page)} dates work by session ordinal; give a date and a commit:\n  " + "\n  ".join(hits)
