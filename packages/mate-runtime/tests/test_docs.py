"""The documentation states what the code does: links resolve, documented limits are the enforced ones, the
examples run, the settings table is complete.

- Every relative link in ``docs/``, ``README.md``, ``packages/*/README.md`` and the other READMEs under
  ``packages/*/tests`` and ``tools`` names an existing file (and, with a ``#fragment``, a heading of it).
- Every ``docs/...`` path cited in the packages (sources and tests), ``tools/``, ``noxfile.py``, ``.ci/run``
  and those pages names an existing file or folder (and a heading, with a ``#fragment``).
- ``docs/benchmarks/`` holds one page per op, each with its runs in one JSON beside it (run id -> date, commit,
  card, command), every run listed on its page, no file of another name.
- ``docs/mamba.md``'s "Enforced limits" table (between ``<!-- enforced-limits:begin -->`` and ``:end -->``) is
  parsed; each row is probed with values inside and outside its accepted set, and a value outside must raise
  the documented error (rows on index data and counts name quantities of the probe's call, which the probe
  supplies). A row without a probe here fails, so a new documented limit needs a check. Limits only
  a GPU can reach (the TileLang launchers' sequence count) are probed by GPU-marked tests, skipped elsewhere.
- The README's and ``docs/mamba.md``'s Python examples run on the CPU (the reference backend).
- Every variable of ``mate.mamba.settings`` is in ``docs/mamba.md``'s settings table with its default listed first.
- No page dates work by an ordinal of the project's own history: measurements carry a
  date and a commit.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
MAMBA_MD = DOCS / "mamba.md"


def doc_files() -> list[Path]:
    readmes = [ROOT / "README.md", *ROOT.glob("packages/*/README.md")]
    return sorted({*DOCS.rglob("*.md"), *readmes, *ROOT.glob("packages/*/tests/**/*.md"), *ROOT.glob("tools/**/*.md")})


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


# A ``docs/`` path inside a sentence, code or a string (not the tail of a URL or of a longer path).
CITED_DOCS_PATH = re.compile(r"(?<![\w./-])docs/[\w./#-]*")
SOURCE_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".pth", ".h"}


def citing_files() -> list[Path]:
    trees = [*ROOT.glob("packages/*/src"), *ROOT.glob("packages/*/tests"), ROOT / "tools"]
    found = {f for tree in trees for f in tree.rglob("*") if f.suffix in SOURCE_SUFFIXES and f.is_file()}
    return sorted(found | {ROOT / "noxfile.py", ROOT / ".ci" / "run", ROOT / "pyproject.toml"} | set(doc_files()))


@pytest.mark.parametrize("source", citing_files(), ids=rel)
def test_cited_docs_paths_exist(source):
    missing = []
    for m in CITED_DOCS_PATH.finditer(source.read_text()):
        path, _, fragment = m.group(0).rstrip(".-#").partition("#")
        dest = ROOT / path
        if not dest.exists():
            missing.append(f"{m.group(0)}: no such file or folder")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            missing.append(f"{m.group(0)}: no heading #{fragment} in {path}")
    assert not missing, f"{rel(source)} cites what docs/ does not hold:\n  " + "\n  ".join(missing)


BENCHMARKS = DOCS / "benchmarks"


def test_benchmarks_one_page_per_op():
    files = sorted(BENCHMARKS.iterdir())
    assert {f.suffix for f in files} <= {".md", ".json", ".png"}, [f.name for f in files]
    pages = {f.stem for f in files if f.suffix == ".md"}
    stray = [f.name for f in files if f.stem not in pages]
    assert not stray, f"docs/benchmarks/ holds files of no page (a page, its JSON and its plot per op): {stray}"
    for data in (f for f in files if f.suffix == ".json"):
        assert data.stem in pages, f"{data.name} has no page {data.stem}.md beside it"
        runs = json.loads(data.read_text())
        page = (BENCHMARKS / f"{data.stem}.md").read_text()
        assert runs and isinstance(runs, dict), f"{data.name}: expected {{run id: run}}"
        for run_id, run in runs.items():
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", run["date"]), (data.name, run_id, run.get("date"))
            assert re.fullmatch(r"[0-9a-f]{7,40}", run["commit"]), (data.name, run_id, run.get("commit"))
            assert run["card"] and run["command"], (data.name, run_id)
            assert f"`{run_id}`" in page, f"{data.stem}.md does not list the run {run_id} of {data.name}"
    shown = {(doc.parent / link.partition("#")[0]).resolve() for doc in doc_files() for link in relative_links(doc)}
    for plot in (f for f in files if f.suffix == ".png"):
        assert plot.resolve() in shown, f"{rel(plot)} is shown on no page"


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


def _clause(text: str, ctx: dict):
    """A predicate for one clause of an 'accepted' cell on named quantities of the probe's call (``ctx``): index
    data (a table's values, flattened) or a count."""

    def flat(v):
        return torch.as_tensor(v).flatten().tolist() if not isinstance(v, int) else [v]

    def ascending(v):
        return all(a <= b for a, b in zip(v, v[1:], strict=False))

    if m := re.fullmatch(r"non-decreasing from 0 to (\w+)", text):
        n = ctx[m.group(1)]
        return lambda v: flat(v)[0] == 0 and ascending(flat(v)) and flat(v)[-1] == n
    if m := re.fullmatch(r"non-decreasing within \[0, (\w+)\]", text):
        n = ctx[m.group(1)]
        return lambda v: flat(v)[0] >= 0 and ascending(flat(v)) and flat(v)[-1] <= n
    if m := re.fullmatch(r"steps of at most (\w+)", text):
        n = ctx[m.group(1)]
        return lambda v: all(b - a <= n for a, b in zip(flat(v), flat(v)[1:], strict=False))
    if m := re.fullmatch(r"no step across (\w+)", text):
        cuts = ctx[m.group(1)]
        return lambda v: not any(a < c < b for a, b in zip(flat(v), flat(v)[1:], strict=False) for c in cuts)
    if m := re.fullmatch(r"in \[0, (\w+)\)( or pad_slot_id)?", text):
        n, pad = ctx[m.group(1)], ctx["pad_slot_id"] if m.group(2) else None
        return lambda v: all(0 <= e < n or e == pad for e in flat(v))
    if m := re.fullmatch(r"(at most|below) (\w+)", text):
        n = ctx[m.group(2)]
        return lambda v: all(e <= n if m.group(1) == "at most" else e < n for e in flat(v))
    if m := re.fullmatch(r"at least (\w+) / (\w+)", text):
        n = -(-ctx[m.group(1)] // ctx[m.group(2)])
        return lambda v: v >= n
    raise AssertionError(f"test_docs.py cannot read the accepted cell clause {text!r}")


def accepts(spec: str, ctx: dict | None = None):
    """A predicate for the table's 'accepted' cell: a comma list, 'multiples of n', 'at most n' or 'powers of two
    from n'; with ``ctx`` (the named quantities of the probe's call), '; '-separated clauses on them."""
    if ctx is not None:
        preds = [_clause(c.strip(), ctx) for c in spec.split(";")]
        return lambda v: all(p(v) for p in preds)
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
    from mate.mamba._tilelang.ssd import _check_supported

    args = dict(dim=64, dstate=128, chunk_size=128, io_dtype=torch.bfloat16) | kw
    _check_supported(args["dim"], args["dstate"], args["chunk_size"], args["io_dtype"])


def _i(v):
    return torch.tensor(v, dtype=torch.int32)


SSD_TABLES = dict(cu_seqlens=[0, 12, 20], cu_chunk_seqlens=[0, 8, 12, 20], seq_idx=[0, 0, 1], last_chunk_indices=[1, 2])
SSD_CTX = dict(tokens=20, chunk_size=8, cu_seqlens=[0, 12, 20], batch=2, nchunks=3, slots=3)


def ssd_tables(**tables):
    """A prefill of 20 tokens in two sequences (12 + 8), chunk size 8, with some tables replaced."""
    from mate.mamba import ssd_combined_fwd_varlen

    t = {k: _i(v) for k, v in (SSD_TABLES | tables).items()}
    fsi = t.pop("final_state_indices", None)
    pool = dict(final_states_out=torch.zeros(3, 2, 4, 4), final_state_indices=fsi) if fsi is not None else {}
    x, B = torch.randn(20, 2, 4), torch.randn(20, 1, 4)
    return ssd_combined_fwd_varlen(
        x, torch.rand(20, 2), -torch.rand(2), B, B, 8, t["cu_seqlens"], t["cu_chunk_seqlens"],
        t["last_chunk_indices"], t["seq_idx"], **pool, backend="torch",
    )  # fmt: skip


def ssd_nchunks(n):
    """The 20-token prefill chunked into ``n`` chunks of at most 8 tokens where possible (none crossing token 12)."""
    cuts = {1: [0, 20], 2: [0, 12, 20], 3: [0, 8, 12, 20], 4: [0, 4, 8, 12, 20], 5: [0, 4, 8, 12, 16, 20]}[n]
    seq = [0 if a < 12 else 1 for a in cuts[:-1]]
    last = [seq.index(1) - 1 if 1 in seq else 0, n - 1]
    return ssd_tables(cu_chunk_seqlens=cuts, seq_idx=seq, last_chunk_indices=last)


SSU_CTX = dict(slots=4, pad_slot_id=-1, rows=4, columns=2, entries=3, cache_steps=2)


def ssu_tables(form, **tables):
    """A decode call over a 4-slot pool: ``one`` token for 2 sequences, ``packed`` rows (4, cu_seqlens),
    ``dense`` 2 x 2 tokens with 2-D tables, ``ibuf`` the dense form into a [3, 2] intermediate buffer."""
    from mate.mamba import selective_state_update

    H, P, N = 2, 4, 8
    lead = {"one": (2,), "packed": (4,), "dense": (2, 2), "ibuf": (2, 2)}[form]
    kw = dict(
        state=torch.zeros(4, H, P, N), x=torch.randn(*lead, H, P), dt=torch.rand(*lead, H, P), A=-torch.rand(H),
        B=torch.randn(*lead, 1, N), C=torch.randn(*lead, 1, N), D=None,
    )  # fmt: skip
    if form == "packed":
        kw |= dict(cu_seqlens=_i([0, 2, 4]), state_batch_indices=_i([0, 1]))
    elif form == "dense":
        kw |= dict(state_batch_indices=_i([[0, 1], [2, 3]]))
    elif form == "ibuf":
        kw |= dict(state_batch_indices=_i([0, 1]), intermediate_states_buffer=torch.zeros(3, 2, H, P, N))
    kw |= {k: _i(v) for k, v in tables.items()}
    return selective_state_update(**kw, backend="torch")


# (backend, op, parameter) -> (values to probe, call with one value[, the named quantities the accepted cell's
# clauses read]). The accepted values must pass, the
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
    ("every", "ssd", "chunks"): ((1, 2, 3, 4, 5), ssd_nchunks, SSD_CTX),
    ("index data", "ssd", "cu_seqlens"): (
        ([0, 12, 20], [0, 8, 20], [0, 20, 12], [0, 12, 19], [1, 12, 20], [0, 12, 21], [-1, 12, 20]),
        lambda v: ssd_tables(cu_seqlens=v),
        SSD_CTX,
    ),
    ("index data", "ssd", "cu_chunk_seqlens"): (
        (
            [0, 8, 12, 20],
            [0, 4, 12, 20],
            [0, 8, 12, 12],
            [0, 8, 16, 20],
            [0, 8, 12, 19],
            [0, 12, 8, 20],
            [0, 2, 12, 20],
            [1, 8, 12, 20],
            [0, 8, 12, 21],
        ),
        lambda v: ssd_tables(cu_chunk_seqlens=v),
        SSD_CTX,
    ),  # fmt: skip
    ("index data", "ssd", "seq_idx"): (
        ([0, 0, 1], [0, 1, 1], [1, 1, 1], [0, 0, 2], [-1, 0, 1]),
        lambda v: ssd_tables(seq_idx=v),
        SSD_CTX,
    ),
    ("index data", "ssd", "last_chunk_indices"): (
        ([1, 2], [0, 0], [2, 3], [-1, 2]),
        lambda v: ssd_tables(last_chunk_indices=v),
        SSD_CTX,
    ),
    ("index data", "ssd", "final_state_indices"): (
        ([0, 2], [2, 1], [0, 3], [-1, 0]),
        lambda v: ssd_tables(final_state_indices=v),
        SSD_CTX,
    ),
    ("index data", "ssu", "cu_seqlens"): (
        ([0, 2, 4], [0, 1, 3], [0, 0, 4], [0, 3, 2], [-1, 2, 4], [0, 2, 5]),
        lambda v: ssu_tables("packed", cu_seqlens=v),
        SSU_CTX,
    ),
    ("index data", "ssu", "state_batch_indices"): (
        ([0, 1], [3, 2], [-1, 2], [4, 0], [-2, 0]),
        lambda v: ssu_tables("one", state_batch_indices=v),
        SSU_CTX,
    ),
    ("index data", "ssu", "dst_state_batch_indices"): (
        ([[0, 1], [2, 3]], [[-1, 1], [2, 3]], [[0, 4], [2, 3]], [[0, 1], [-5, 3]]),
        lambda v: ssu_tables("dense", dst_state_batch_indices=v),
        SSU_CTX,
    ),
    ("index data", "ssu", "num_accepted_tokens"): (
        ([1, 2], [0, 0], [2, 2], [3, 1], [1, 5]),
        lambda v: ssu_tables("dense", num_accepted_tokens=v),
        SSU_CTX,
    ),
    ("index data", "ssu", "intermediate_state_indices"): (
        ([0, 2], [2, 1], [3, 0], [-1, 0]),
        lambda v: ssu_tables("ibuf", intermediate_state_indices=v),
        SSU_CTX,
    ),
    ("index data", "ssu", "retrieve_parent_token"): (
        ([[-1, 0], [-1, 1]], [[-1, -1], [-1, -1]], [[-1, 2], [-1, 0]], [[0, 0], [-1, 3]]),
        lambda v: ssu_tables("ibuf", retrieve_parent_token=v),
        SSU_CTX,
    ),
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
    values, call, *ctx = PROBES[key]
    ok = accepts(limit["accepted"], *ctx)
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


def test_block_scaled_states_as_the_page_says():
    """The prose under the table: an int16 state needs its scales (ValueError naming them), is served by the
    reference with them and planned for the TileLang kernels, which refuse a buffer of another dtype beside it
    (NotImplementedError)."""
    from mate.mamba import selective_state_update
    from mate.mamba._contract.ssu import normalize_ssu
    from mate.mamba._tilelang import ssu_plan

    with pytest.raises(ValueError, match="^state_scale:"):
        run_ssu(state=torch.int16)
    args = ssu_args(state=torch.int16)
    scale = torch.ones(args["state"].shape[:3])
    selective_state_update(**args, state_scale=scale, backend="torch")
    spec, _ = ssu_plan.plan(normalize_ssu(**args, state_scale=scale))
    assert spec.state_dtype == "int16"


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
    from mate.mamba import settings

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
