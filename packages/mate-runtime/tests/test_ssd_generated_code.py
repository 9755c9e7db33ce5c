"""The SSD kernel's generated CUDA (sm_90a, compiled on the CPU with nvcc): hazards that TileLang 0.1.15's
warp specialisation can introduce and that a compile check does not see.

- The producer warpgroup (``threadIdx.x < 128`` under warp specialisation) must only issue TMA loads and wait
  on / arm barriers. A consumer loop that reads global memory was once moved there (the fused kernel's
  z-reading epilogue without D: wrong output on the H200, fixed in f420745).
- Every shared buffer a TMA load fills must be waited on (its mbarrier) in the consumer before its first use
  (TileLang once issued a TMA load before a pipelined loop but placed its wait inside the loop, after the
  wgmma that read the buffer, in a since-removed chunk-parallel kernel).

Both checks read the text of ``get_kernel_source()``; ``test_checks_can_fail`` mutates a real source to show
each check flags what it is meant to.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("tilelang") is None, reason="needs TileLang"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="compiling for sm_90a needs nvcc"),
]

TARGET = {"kind": "cuda", "arch": "sm_90a"}

# What a producer branch may contain: loops, TMA issue by an elected thread, barrier waits / arms, and the
# chunk-offset bookkeeping that feeds the TMA coordinates.
_PRODUCER_OK = re.compile(
    r"^\s*(#pragma unroll|for \(int \w+ = 0; \w+ < [\w() +\-*]+; \+\+\w+\) \{|\}|"
    r"tl::warpgroup_reg_dealloc<\d+>\(\);|tl::fence_proxy_async\(\);|"
    r"mbarrier\[.*\]\.(wait|arrive_and_expect_tx)\(.*\);|if \(tl::tl_shuffle_elect<\d+>\(\)\) \{|"
    r"tl::tma_load\(.*\);|int (condval\w*|s0\w*|c_first\w*|n_tiles\w*);|"
    r"condval\w* = (cu_chunk_seqlens|bounds)\[.*\];|condval\w* = 0;|if \(.*\) \{|\} else \{|"
    r"int (s0|c_first|n_tiles)\w* = .*;|"
    # the floor division / modulo of the tile counter by the tiles per head (several heads per CTA)
    r"(int|int64_t) r(div|mod)\w* = \(+(\(int64_t\))?j\)? [/%] \(*(\(int64_t\))?n_tiles\)*;)\s*$"
)
_TMA_DESC = re.compile(r"tl::tma_load\(\w+_desc, mbarrier\[(.+?)\], \(&\(\(\(\w+\*\)(\w+)\)")
_TMA_BULK = re.compile(r"tl::tma_load\(\(&\(\(\(\w+\*\)(\w+)\)\[.*\]\)\), .*, mbarrier\[(.+?)\], \d+\);")
_SPLIT = "if (((int)threadIdx.x) < 128) {"


def _norm(expr: str) -> str:
    """A barrier index with the loop variable's numeric suffix dropped (producer ``j``, consumer ``j_1``)."""
    return re.sub(r"\b([a-z]+)_\d+\b", r"\1", expr).replace(" ", "")


def _wait_bar(line: str) -> str | None:
    """The (normalised) barrier index a ``mbarrier[...].wait(...)`` line waits on, else None."""
    m = re.match(r"\s*mbarrier\[(.+)\]\.wait\(", line)
    return _norm(m.group(1)) if m else None


def branches(src: str) -> tuple[list[str], list[str], list[str]]:
    """(before the warp-specialised split, producer branch, consumer branch) lines of a kernel's source."""
    lines = src.splitlines()
    i0 = next(i for i, line in enumerate(lines) if line.strip() == _SPLIT)
    depth = 0
    for i in range(i0, len(lines)):
        if depth == 1 and lines[i].strip() == "} else {":
            return lines[:i0], lines[i0 + 1 : i], lines[i + 1 :]
        depth += lines[i].count("{") - lines[i].count("}")
    raise AssertionError("no consumer branch")


def producer_foreign(src: str) -> list[str]:
    """Producer-branch statements other than TMA issue, barriers and chunk-offset bookkeeping."""
    _, producer, _ = branches(src)
    return [line.strip() for line in producer if not _PRODUCER_OK.match(line)]


def tma_wait_problems(src: str) -> list[str]:
    """TMA-filled shared buffers whose first consumer use comes before a wait on their barrier."""
    loads = {}
    for line in src.splitlines():
        if m := _TMA_DESC.search(line):
            loads[m.group(2)] = _norm(m.group(1))
        if m := _TMA_BULK.search(line):
            loads[m.group(1)] = _norm(m.group(2))
    _, _, consumer = branches(src)
    problems = []
    for buf, bar in loads.items():
        use = next((k for k, line in enumerate(consumer) if re.search(rf"\b{buf}\b", line)), None)
        wait = next((k for k, line in enumerate(consumer) if _wait_bar(line) == bar), None)
        if use is not None and (wait is None or wait > use):
            problems.append(f"{buf}: first consumer use at +{use}, wait on mbarrier[{bar}] at {wait}")
    assert loads, "no TMA loads found: the parser no longer matches TileLang's output"
    return problems


_TMA_STORE = re.compile(r"tl::tma_store\(\w+, \(&\(\(\(\w+\*\)(\w+)\)")
_BARRIER = re.compile(r"__sync_thread_partial|__syncthreads|\.arrive\(")


def _tile_loop(consumer: list[str]) -> tuple[int, int]:
    """The consumer's pipelined tile loop: (its ``for`` line, the line of its closing brace)."""
    lo = next(k for k, line in enumerate(consumer) if re.match(r"\s*for \(int j_\d+ = 0; j_\d+ < ", line))
    depth = 0
    for k in range(lo, len(consumer)):
        depth += consumer[k].count("{") - consumer[k].count("}")
        if depth == 0:
            return lo, k
    raise AssertionError("the tile loop does not close")


def tma_store_problems(src: str) -> list[str]:
    """TMA stores whose shared source may be overwritten while the store still reads it. The issuing thread must
    wait for the store's reads (``tma_store_wait``) and a consumer barrier must follow that wait before the
    buffer's next write in program order, which may be in the next tile (the loop wraps): any consumer thread
    may write it after the barrier (the lean design reuses the output tile for the weighted x). On the way out
    of the loop a wait must come before the CTA exits (shared memory would be released under the store)."""
    _, _, consumer = branches(src)
    lo, hi = _tile_loop(consumer)
    problems = []
    for i, line in enumerate(consumer):
        if not (m := _TMA_STORE.search(line)):
            continue
        buf = m.group(1)
        path = consumer[i + 1 : hi] + (consumer[lo + 1 : i] if lo < i < hi else [])
        write = next(
            (k for k, ln in enumerate(path) if buf in (g for w in _SMEM_WRITE.finditer(ln) for g in w.groups())), None
        )
        ahead = path[:write] if write is not None else path
        wait = next((k for k, ln in enumerate(ahead) if "tma_store_wait" in ln), None)
        barrier = None if wait is None else next((k for k, ln in enumerate(ahead[wait:]) if _BARRIER.search(ln)), None)
        if write is not None and (wait is None or barrier is None):
            problems.append(
                f"store of {buf} at +{i}: next write at +{write} after it, wait at {wait}, barrier at {barrier}"
            )
        if not any("tma_store_wait" in ln for ln in consumer[i + 1 :]):
            problems.append(f"store of {buf} at +{i}: no wait before the CTA exits")
    return problems


_DESC_INIT = re.compile(r"initialize_wgmma_descriptor<.*>\(\w+, \(&\(\(\(\w+\*\)(\w+)\)")
_WG_WAIT = re.compile(r"tl::(?:warpgroup_wait|wait_wgmma)<(\d+)>\(\);")
_ARRIVE = re.compile(r"\s*mbarrier\[(.+)\]\.arrive\(\);")
_SMEM_WRITE = re.compile(
    r"(?:\(\(\w+\*\)(\w+)\)\[[^\]]*\]|\*\(\w+\*\)\(\(\(\w+\*\)(\w+)\)[^=]*\)) = |"
    r"ptx_stmatrix\w*\(\(&\(\(\(\w+\*\)(\w+)\)"
)


def async_wgmma_problems(src: str) -> list[str]:
    """Shared buffers read by a wgmma group that is still in flight (committed, not yet covered by a
    ``warpgroup_wait<n>`` / ``wait_wgmma<n>``) when the consumers release them to the producer (the arrive on the
    barrier the producer waits on before reloading the buffer) or write them. TileLang places a pipelined
    buffer's release right after the last GEMM reading it in program order, whatever that GEMM's wait."""
    _, producer, consumer = branches(src)
    empty = {}  # release barrier -> buffer, from the producer's wait before each TMA load
    bar = None
    for line in producer:
        bar = _wait_bar(line) or bar
        if bar is not None and (m := _TMA_DESC.search(line) or _TMA_BULK.search(line)):
            empty[bar] = m.group(2) if m.re is _TMA_DESC else m.group(1)
            bar = None
    problems, pending, reads = [], [], set()
    for i, line in enumerate(consumer):
        if m := _DESC_INIT.search(line):
            reads.add(m.group(1))
        elif "tl::warpgroup_commit_batch();" in line:
            pending.append(reads)
            reads = set()
        elif m := _WG_WAIT.search(line):
            del pending[: max(0, len(pending) - int(m.group(1)))]
        in_flight = set().union(*pending) if pending else set()
        if (m := _ARRIVE.match(line)) and empty.get(_norm(m.group(1))) in in_flight:
            problems.append(f"+{i}: {empty[_norm(m.group(1))]} released while a wgmma reading it is in flight")
        for m in _SMEM_WRITE.finditer(line):
            buf = next(g for g in m.groups() if g)
            if buf in in_flight:
                problems.append(f"+{i}: {buf} written while a wgmma reading it is in flight")
    assert empty, "no producer waits before TMA loads found: the parser no longer matches TileLang's output"
    return problems


def _spec(*, H, G, P, N, L, has_D=True, D_per_dim=False, prefetch=False, split=False, states=False):
    from mate.mamba._tilelang.ssd_plan import scan_spec, states_spec

    scan = scan_spec(
        H=H, G=G, P=P, N=N, L=L, io="bfloat16", D="float32", D_per_dim=D_per_dim, cu="int32", has_D=has_D,
        state="float32", init="float32", sq="int32", intermediate=False, prefetch=prefetch, split=split,
    )  # fmt: skip
    return states_spec(scan) if states else scan


@functools.cache
def source(spec) -> str:
    """The scan kernel's CUDA source for sm_90a."""
    from mate.mamba._tilelang.cache import compile_prim_func

    return compile_prim_func(spec.build(), target=TARGET, pass_configs=spec.pass_configs()).get_kernel_source()


SMALL = dict(H=8, G=2, P=64, N=128, L=128)  # 128-token tiles, scores in registers, GEMMs in two asynchronous pairs
FALCON = dict(H=8, G=1, P=128, N=256, L=256)  # 64-token tiles, scores in shared memory, two P blocks
KERNELS = [
    pytest.param(dict(SMALL), id="c128"),
    pytest.param(dict(SMALL, D_per_dim=True), id="D-per-dim"),
    pytest.param(dict(FALCON), id="tile64_P128_N256"),
    pytest.param(dict(SMALL, P=80), id="tail-P80"),  # a 64-wide main part and a 16-wide tail: seven GEMMs
    pytest.param(dict(SMALL, P=80, L=64), id="narrow-P80_c64"),  # the K-major tiling: GEMMs waited one by one
    pytest.param(dict(SMALL, prefetch=True), id="prefetch"),  # the L2 prefetch of the next entering state
    pytest.param(dict(SMALL, split=True), id="split"),  # runs entering mid-sequence with the handed-over state
    pytest.param(dict(SMALL, P=80, split=True), id="split-tail-P80"),
]
# the split design's state pass: TMA loads through its own pipeline, one GEMM per tile
STATE_PASSES = [
    pytest.param(dict(SMALL, states=True), id="state-pass_c128"),
    pytest.param(dict(FALCON, states=True), id="state-pass_P128_N256"),
    pytest.param(dict(SMALL, P=80, states=True), id="state-pass_narrow-P80"),
]


def _source(shape) -> str:
    return source(_spec(**shape))


@pytest.mark.parametrize("spec", KERNELS)
def test_producer_branch_only_issues_tma(spec):
    src = _source(spec)
    assert producer_foreign(src) == []
    _, _, consumer = branches(src)  # the epilogue's z read (f420745) stays with the consumers
    assert any("z[" in line for line in consumer)


@pytest.mark.parametrize("spec", STATE_PASSES)
def test_state_pass_producer_only_issues_tma(spec):
    assert producer_foreign(_source(spec)) == []


@pytest.mark.parametrize("spec", KERNELS + STATE_PASSES)
def test_tma_buffers_are_waited_on_before_use(spec):
    assert tma_wait_problems(_source(spec)) == []


@pytest.mark.parametrize("spec", KERNELS)
def test_tma_store_reads_finish_before_the_next_barrier(spec):
    src = _source(spec)
    assert "tl::tma_store(" in src, "the scan kernel stores full tiles by TMA"
    assert tma_store_problems(src) == []
    # the check fails without the wait
    mutated = re.sub(r"\n[^\n]*tma_store_wait[^\n]*", "", src)
    assert tma_store_problems(mutated)


@pytest.mark.parametrize("spec", KERNELS)
def test_overlap_waits_once_per_pair(spec):
    """Per tile the kernel issues its four GEMMs in two asynchronous groups (C.state + C B^T, S x + the end-state
    GEMM) and waits once per group; a tail part adds its three GEMMs to the groups (seven, two waits); the
    narrow-P tiling waits for each GEMM at once."""
    src = _source(spec)
    waits = re.findall(r"tl::(warpgroup_wait|wait_wgmma)<(\d)>", src)
    narrow = spec.get("P") == 80 and spec["L"] == 64
    tail = spec.get("P") == 80 and not narrow
    assert len(re.findall(r"tl::warpgroup_commit_batch\(\);", src)) == (7 if tail else 4)  # a group per GEMM
    assert waits == [("warpgroup_wait", "0")] * (4 if narrow else 2)


@pytest.mark.parametrize("spec", KERNELS + STATE_PASSES)
def test_no_buffer_is_released_or_written_under_a_wgmma_in_flight(spec):
    assert async_wgmma_problems(_source(spec)) == []


def test_async_wgmma_check_can_fail():
    src = _source(SMALL)
    # without the end-state GEMM's wait, B_s is released (and the output tile, its x-weighted buffer, written)
    # with that GEMM in flight
    before, producer, consumer = branches(src)
    commits = [i for i, line in enumerate(consumer) if "warpgroup_commit_batch" in line]
    wait = next(i for i in range(commits[-1], len(consumer)) if _WG_WAIT.search(consumer[i]))
    lines = src.splitlines()
    del lines[len(before) + 1 + len(producer) + 1 + wait]  # (the split line and the "} else {" between)
    problems = async_wgmma_problems("\n".join(lines))
    assert any("B_s released" in p for p in problems) and any("written" in p for p in problems)


def test_checks_can_fail():
    src = _source(SMALL)
    _, producer, consumer = branches(src)
    # drop the consumer's first wait on the barrier of the x tile: x_s is read unwaited
    bar = _norm(_TMA_DESC.search(next(line for line in producer if "x_desc" in line)).group(1))
    k = next(i for i, line in enumerate(consumer) if _wait_bar(line) == bar)
    mutated = src.replace(consumer[k] + "\n", "", 1)
    assert any(p.startswith("x_s:") for p in tma_wait_problems(mutated))
    # a global read moved into the producer (what the warp-specialisation pass did to the fused epilogue)
    mutated = src.replace(producer[0] + "\n", producer[0] + "\n    float zv = z_probe[threadIdx.x];\n", 1)
    assert producer_foreign(mutated) == ["float zv = z_probe[threadIdx.x];"]


def test_the_scan_without_d_releases_x_under_a_wgmma():
    """Why the planner never plans ``has_D=False``: in that schedule x_s goes back to the producer while the S x
    wgmma that reads it may still be in flight (the epilogue has no ``D * x`` read to hold the release back)."""
    problems = async_wgmma_problems(_source(dict(SMALL, has_D=False)))
    assert any("x_s released" in p for p in problems)
