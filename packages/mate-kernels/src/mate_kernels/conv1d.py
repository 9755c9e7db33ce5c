"""TileLang kernel factories for the causal conv1d of a Mamba2 layer (vLLM 0.33's ``causal_conv1d_update`` and
``causal_conv1d_fn``): :func:`conv1d_update_kernel` and :func:`conv1d_fn_kernel`, each a spec's fields in, a
``T.prim_func`` out. The math and the rounding are the contract's (``mate.mamba._contract.conv1d``): x read in the
pool's dtype, products rounded to ``prod_dtype``, an fp32 sum from the bias in tap order, the result rounded to
the pool's dtype first where ``round_via_state``.

Both kernels give a thread ``vec`` consecutive channels: it keeps their ``W - 1`` previous inputs in registers and
slides them along the tokens, so each input and output is touched once. Threads of a CTA hold consecutive channel
groups: the loads and stores of a token are coalesced when the tensors are channel-contiguous (vLLM's layout).
With ``vec == 1`` every stride is a runtime value (one compiled kernel for any pool view). With ``vec > 1`` (8 or
16 bytes of the widest dtype, :func:`vector_width`) x, out and the pool have channel stride 1 and every other
stride a multiple of ``vec``, the weight is a dense ``[D, W]`` and the bias dense, all 16-byte aligned and
``D % vec == 0`` (the planner's conditions): each token's x, out and pool column, and a thread's weights, move in
vectors. Every index is guarded or clamped, so no value of the tables makes a kernel read or write outside its
tensors.

``conv1d_update_kernel``: grid (channel blocks, sequences). A thread issues every load of its sequence before
any math: the tables (slot, query start, accepted count), then the history (the ``W - 1`` pool columns at the
accepted offset), its weights and bias and the sequence's first ``group`` tokens, at indices clamped into the
tensors, so a sequence waits two memory round trips (tables, then the rest). The rewritten pool columns are the
history's and the tokens' registers (vLLM's columns all lie inside them), stored with the outputs; a sequence on
the null block (or a slot outside the pool) stores nothing. Tokens past the first ``group`` run one at a time.

``conv1d_fn_kernel``: grid (token blocks of ``block_t``, channel blocks). A CTA finds the sequences its tokens
belong to by binary search over ``query_start_loc`` and runs each one's tokens; a sequence's first ``W - 1``
tokens (whose window reaches into the initial state) are run by the CTA holding its first token, also beyond its
block, and that CTA alone reads the slot's initial state and writes the final one: no CTA reads a state another
writes. Tokens of skipped sequences and past the last one are written as zeros. A thread takes its tokens
:data:`GROUP` at a time (their loads in flight together).

Both keep the window in the products' dtype, tap-major, so that one tap over a thread's channels is one vector
multiply: packed bf16x2 / f16x2 where the products are 16-bit (the product of two 16-bit values is exact in fp32,
so rounding it once is the contract's rounding), each product widened to fp32 by one bit operation, the sum in
fp32.
"""

# no ``from __future__ import annotations``: TileLang evaluates the prim_func annotations (closure variables)

MAX_WIDTH = 6

# the tuning space: threads per CTA, channels per thread (1: the scalar form; else 8 or 16 bytes of the widest
# dtype), for the prefill tokens per CTA and for the update a sequence's tokens a thread loads together; the
# planner's table
THREADS = (32, 64, 128, 256)
VEC = (1, 2, 4, 8)
BLOCK_T = (32, 64, 128)
UPDATE_GROUPS = (1, 2, 4, 8)
GROUP = 4  # the prefill's tokens per step of a thread (their loads in flight together)
# the prefill's __launch_bounds__ up to width 4: registers capped at 64 per thread, 8 CTAs of 128 threads per SM
# (its loop takes no more instructions and spills nothing there; uncapped, ptxas spends 155 registers on overlapping
# tokens; widths 5 and 6 would spill)
PREFILL_THREADS_PER_SM = 1024


def _check(width: int, threads: int, vec: int) -> None:
    if not 2 <= width <= MAX_WIDTH:
        raise ValueError(f"width: expected 2..{MAX_WIDTH}, got {width!r}")
    if threads not in THREADS:
        raise ValueError(f"threads: expected one of {THREADS}, got {threads!r}")
    if vec not in VEC:
        raise ValueError(f"vec: expected one of {VEC}, got {vec!r}")


def _silu(T, a):
    """The hardware's exp and division (a few ulp of fp32): the IEEE ones were most of the prefill's issue."""
    return T.call_extern("float32", "__fdividef", a, T.float32(1.0) + T.call_extern("float32", "__expf", -a))


def _finish(T, a, *, silu: bool, state_dtype: str, out_dtype: str, via_state: bool):
    if silu:
        a = _silu(T, a)
    if via_state:
        a = T.cast(a, state_dtype)
    return T.cast(a, out_dtype)


def _layout(T, V: int, strides: tuple, dim_axis: int) -> tuple:
    """A tensor's strides as declared: all runtime in the scalar form; the vector form's channel stride is 1."""
    return tuple(1 if V > 1 and i == dim_axis else st for i, st in enumerate(strides))


def _aligned(T, V: int, buf, dim_axis: int):
    """``buf`` with its other strides written as multiples of ``V`` (the planner guarantees they are), so TileLang
    can prove the 16-byte accesses."""
    if V == 1:
        return buf
    strides = [1 if i == dim_axis else T.floordiv(st, V) * V for i, st in enumerate(buf.strides)]
    return T.view(buf, strides=strides)


def _weights(T, V: int, W: int, D, dtype: str, w0, w1):
    """The weight's declared type: runtime strides in the scalar form, dense ``[D, W]`` in the vector form (a
    thread's ``V * W`` weights are then consecutive)."""
    return T.StridedTensor((D, W), (w0, w1), dtype) if V == 1 else T.Tensor((D, W), dtype)


def conv1d_update_kernel(*, width: int, x_dtype: str, state_dtype: str, weight_dtype: str, bias_dtype: str,
                         slot_dtype: str, acc_dtype: str, qsl_dtype: str, has_bias: bool, silu: bool, varlen: bool,
                         spec_decode: bool, has_slots: bool, has_null: bool, round_via_state: bool, threads: int = 128,
                         vec: int = 1, group: int = 1):  # fmt: skip
    """The decode update. Arguments, positionally: ``x [rows, D, T]`` and ``out`` (x's dtype), ``weight [D, W]``,
    ``bias [nb]`` (a dummy without one), ``state [S, D, K]``, ``slots [ns]``, ``accepted [na]``, ``qsl [nq]``
    (their dtypes; dummies where absent), then ``batch``, ``seqlen`` (T, or max_query_len packed) and ``null_id``
    (int64). ``group``: a sequence's tokens a thread loads before computing them (:data:`UPDATE_GROUPS`)."""
    _check(width, threads, vec)
    if group not in UPDATE_GROUPS:
        raise ValueError(f"group: expected one of {UPDATE_GROUPS}, got {group!r}")
    import tilelang.language as T

    W, TH, V, G = width, threads, vec, group
    f32, i64 = "float32", "int64"
    pd = state_dtype if state_dtype == weight_dtype else f32  # the products' dtype (the contract's)
    load_taps = _load_taps(T, V=V, W=W, weight_dtype=weight_dtype, pd=pd)
    store_s = _store_vector(T, V=V, dtype=state_dtype)
    store_x = _store_vector(T, V=V, dtype=x_dtype)
    token_out = _token_out(T, V=V, W=W, pd=pd, silu=silu, state_dtype=state_dtype, x_dtype=x_dtype,
                           via_state=round_via_state)  # fmt: skip
    rows, D, Tn, S, K = T.dynamic("rows, D, Tn, S, K")
    nb, ns, na, nq = T.dynamic("nb, ns, na, nq")
    x0, x1, x2, o0, o1, o2, w0, w1, s0, s1, s2 = T.dynamic("x0, x1, x2, o0, o1, o2, w0, w1, s0, s1, s2", i64)
    bs, ss, as_, qs = T.dynamic("bs, ss, as_, qs", i64)

    @T.macro
    def store_column(sa, win, rs, slot, c, k, col):  # window slot k (pool-dtype values) into pool column col
        for v in T.unroll(V):
            rs[v] = T.cast(win[k * V + v], state_dtype)
        store_s(sa, rs, (slot,), c, col)

    @T.macro
    def load_token(xa, win, row, c, t, i):  # token t into window slot i (x rounded to the pool's dtype first)
        for v in T.vectorized(V):
            win[i * V + v] = T.cast(T.cast(xa[row, c + v, t], state_dtype), pd)

    @T.prim_func
    def conv1d_update(
        x: T.StridedTensor((rows, D, Tn), _layout(T, V, (x0, x1, x2), 1), x_dtype),
        out: T.StridedTensor((rows, D, Tn), _layout(T, V, (o0, o1, o2), 1), x_dtype),
        weight: _weights(T, V, W, D, weight_dtype, w0, w1),
        bias: T.StridedTensor((nb,), _layout(T, V, (bs,), 0), bias_dtype),
        state: T.StridedTensor((S, D, K), _layout(T, V, (s0, s1, s2), 1), state_dtype),
        slots: T.StridedTensor((ns,), (ss,), slot_dtype),
        accepted: T.StridedTensor((na,), (as_,), acc_dtype),
        qsl: T.StridedTensor((nq,), (qs,), qsl_dtype),
        batch: T.int32,
        seqlen: T.int32,
        null_id: T.int64,
    ):
        xa, oa, sa = _aligned(T, V, x, 1), _aligned(T, V, out, 1), _aligned(T, V, state, 1)
        with T.Kernel(T.ceildiv(D, TH * V), batch, threads=TH) as (bx, b):
            tx = T.get_thread_binding()
            win = T.alloc_local(((W - 1 + G) * V,), pd)  # the history, then the group's tokens: token i at i * V
            wk = T.alloc_local((W * V,), pd)  # tap j at j * V
            rbw = T.alloc_local((V,), bias_dtype)
            rb = T.alloc_local((V,), f32)
            acc = T.alloc_local((V,), f32)
            prod = T.alloc_local((V,), pd)
            rx = T.alloc_local((V,), x_dtype)
            rs = T.alloc_local((V,), state_dtype)
            slot = T.alloc_var(i64)
            start = T.alloc_var(i64)
            n = T.alloc_var(i64)
            off = T.alloc_var(i64)
            c = (bx * TH + tx) * V
            # the tables; then the history, the parameters and the first G tokens at indices clamped into their
            # tensors (the planner launches only with S, Tn >= 1, and D >= V), all before the first branch: a load
            # is not moved above one, and one whose uses all lie behind a branch is moved below it, so the first
            # token is computed unconditionally and only the stores are guarded
            cc = T.min(bx * TH + tx, T.floordiv(D, V) - 1) * V
            slot = T.cast(slots[b], i64) if has_slots else T.cast(b, i64)
            row = 0 if varlen else b
            if varlen:  # the query's tokens, clamped into x and to max_query_len
                start = T.min(T.max(T.cast(qsl[b], i64), 0), T.cast(Tn, i64))
                n = T.min(T.max(T.min(T.cast(qsl[b + 1], i64), T.cast(Tn, i64)) - start, 0), T.cast(seqlen, i64))
            else:
                start = 0
                n = T.cast(seqlen, i64)
            off = 0
            if spec_decode:  # the accepted window, kept inside the pool's columns
                off = T.min(T.max(T.cast(accepted[b], i64) - 1, 0), T.cast(K - (W - 1), i64))
            live = c + V <= D and slot >= 0 and slot < T.cast(S, i64) and n > 0
            if has_null:
                live = live and slot != null_id
            sc = T.min(T.max(slot, 0), T.cast(S - 1, i64))
            for k in T.unroll(W - 1):
                for v in T.vectorized(V):
                    win[k * V + v] = T.cast(sa[sc, cc + v, off + k], pd)
            load_taps(weight, wk, cc, D)
            for v in T.unroll(V):
                rbw[v] = T.cast(0, bias_dtype)
            if has_bias:
                for v in T.vectorized(V):
                    rbw[v] = bias[cc + v]
            tn = T.max(T.min(n, G) - 1, 0)  # the first G tokens (clamped: the first is loaded for any n)
            for u in T.unroll(G):
                if u <= tn:
                    load_token(xa, win, row, cc, T.min(start + u, T.cast(Tn - 1, i64)), W - 1 + u)
            for v in T.unroll(V):
                rb[v] = T.cast(rbw[v], f32)
            # vLLM's rewrite: columns [0, cols), cols shortened by the query's shortfall; column i < cols - n takes
            # history column i + shift (inside the history: the spec decode's shift is 1), the others the tokens
            cols = T.cast(W - 1 - seqlen, i64) + n + (T.cast(seqlen - 1, i64) if spec_decode else 0)
            shift = 1 if spec_decode else n
            for k in T.unroll(W - 1):
                if live and k >= shift and k - shift < cols - n and k - shift < K:
                    store_column(sa, win, rs, slot, c, k, k - shift)
            for u in T.unroll(G):
                if u == 0 or u < n:
                    if live and cols - n + u >= 0 and cols - n + u < K:
                        store_column(sa, win, rs, slot, c, W - 1 + u, cols - n + u)
                    token_out(win, wk, rb, acc, prod, rx, u)
                    if live:
                        store_x(oa, rx, (row,), c, start + u)
            # a query longer than G: the rest one token at a time
            for k in T.unroll(W - 1):
                for v in T.unroll(V):
                    win[k * V + v] = win[(k + G) * V + v]
            for i in T.serial(T.if_then_else(live, T.max(n - G, 0), 0)):
                t = G + i
                load_token(xa, win, row, c, start + t, W - 1)
                if cols - n + t >= 0 and cols - n + t < K:
                    store_column(sa, win, rs, slot, c, W - 1, cols - n + t)
                token_out(win, wk, rb, acc, prod, rx, 0)
                store_x(oa, rx, (row,), c, start + t)
                for k in T.unroll(W - 1):
                    for v in T.unroll(V):
                        win[k * V + v] = win[(k + 1) * V + v]

    return conv1d_update


def _add_widened(T, *, V: int, dtype: str):
    """The macro ``acc[v] += float(prod[v])`` over a thread's ``V`` channels. A bf16 ``prod`` of even length is read
    as 32-bit words: the high value masked, the low one shifted (one instruction each; a bf16 value is the high
    half of its fp32)."""

    @T.macro
    def add_widened(acc, prod):
        if dtype == "bfloat16" and V % 2 == 0:
            words = T.view(prod, shape=(V // 2,), dtype="uint32")
            for h in T.unroll(V // 2):
                acc[2 * h] = acc[2 * h] + T.reinterpret(words[h] << T.uint32(16), "float32")
                acc[2 * h + 1] = acc[2 * h + 1] + T.reinterpret(words[h] & T.uint32(0xFFFF0000), "float32")
        else:
            for v in T.unroll(V):
                acc[v] = acc[v] + T.cast(prod[v], "float32")

    return add_widened


def _load_taps(T, *, V: int, W: int, weight_dtype: str, pd: str):
    """The macro loading channels ``[c, c + V)``'s weights tap-major into ``wk`` (tap ``j`` at ``j * V``), in the
    products' dtype. The vector form reads its dense ``V * W`` weights as 16-byte vectors; where both dtypes are
    16-bit it pairs them into 32-bit words with byte permutes, once: the loop's packed multiplies then take whole
    words."""
    packed = pd == weight_dtype and pd in ("bfloat16", "float16") and V > 1

    @T.macro
    def load_taps(weight, wk, c, D):
        if V > 1:
            rw = T.alloc_local((V * W,), weight_dtype)
            wflat = T.view(weight, shape=(D * W,))
            for e in T.vectorized(V * W):
                rw[e] = wflat[c * W + e]
        if packed:
            src = T.view(rw, shape=(V * W // 2,), dtype="uint32")
            dst = T.view(wk, shape=(V * W // 2,), dtype="uint32")
            for j in T.unroll(W):
                for h in T.unroll(V // 2):
                    a = 2 * h * W + j  # channel 2h's tap j in rw, then channel 2h + 1's
                    b = a + W
                    sel = T.if_then_else(a % 2 == 1, 0x32, 0x10) + T.if_then_else(b % 2 == 1, 0x7600, 0x5400)
                    dst[j * V // 2 + h] = T.call_extern("uint32", "__byte_perm", src[a // 2], src[b // 2],
                                                        T.cast(sel, "uint32"))  # fmt: skip
        elif V > 1:
            for j in T.unroll(W):
                for v in T.unroll(V):
                    wk[j * V + v] = T.cast(rw[v * W + j], pd)
        else:
            for j in T.unroll(W):
                wk[j] = T.cast(weight[c, j], pd)

    return load_taps


def _store_vector(T, *, V: int, dtype: str):
    """The macro ``dst[*pre, c:c + V, t] = buf`` (``pre``: a tuple of leading indices): the vector form's through
    TileLang's explicit 8- / 16-byte global store (a plain vector copy out of a local may reach the device as 4-byte
    stores)."""
    nbytes = V * _BYTES[dtype]
    words = nbytes // 4

    @T.macro
    def store_vector(dst, buf, pre, c, t):
        if V > 1 and nbytes == 16:
            T.stg128(dst[(*pre, c, t)], T.view(buf, shape=(1,), dtype=f"uint32x{words}")[0])
        elif V > 1 and nbytes == 8:
            T.stg64(dst[(*pre, c, t)], T.view(buf, shape=(1,), dtype=f"uint32x{words}")[0])
        else:
            for v in T.vectorized(V):
                dst[(*pre, c + v, t)] = buf[v]

    return store_vector


def _token_out(T, *, V: int, W: int, pd: str, silu: bool, state_dtype: str, x_dtype: str, via_state: bool):
    """The macro computing one token's output over a thread's ``V`` channels into ``rx`` (x's dtype) from window
    slots ``[u, u + W)`` (tap-major, the products' dtype ``pd``)."""
    add_widened = _add_widened(T, V=V, dtype=pd)

    @T.macro
    def token_out(win, wk, rb, acc, prod, rx, u):
        for v in T.unroll(V):
            acc[v] = rb[v]
        for j in T.unroll(W):
            for v in T.vectorized(V):
                prod[v] = win[(u + j) * V + v] * wk[j * V + v]
            add_widened(acc, prod)
        for v in T.unroll(V):
            acc[v] = _silu(T, acc[v]) if silu else acc[v]
        if via_state:
            for v in T.vectorized(V):
                rx[v] = T.cast(T.cast(acc[v], state_dtype), x_dtype)
        else:
            for v in T.vectorized(V):
                rx[v] = T.cast(acc[v], x_dtype)

    return token_out


def conv1d_fn_kernel(*, width: int, x_dtype: str, state_dtype: str, weight_dtype: str, bias_dtype: str,
                     qsl_dtype: str, slot_dtype: str, has_bias: bool, silu: bool, has_slots: bool, has_init: bool,
                     has_null: bool, threads: int = 128, block_t: int = 64, vec: int = 1):  # fmt: skip
    """The varlen prefill. Arguments, positionally: ``x [D, tokens]`` and ``out`` (x's dtype), ``weight [D, W]``,
    ``bias [nb]``, ``state [S, D, K]``, ``qsl [batch + 1]``, ``slots [ns]`` (their dtypes), ``init [ni]`` (bool;
    dummies where absent), then ``pad_id`` and ``null_id`` (int64)."""
    _check(width, threads, vec)
    if block_t not in BLOCK_T:
        raise ValueError(f"block_t: expected one of {BLOCK_T}, got {block_t!r}")
    import tilelang.language as T

    W, TH, BT, V, G = width, threads, block_t, vec, GROUP
    f32, i64 = "float32", "int64"
    pd = state_dtype if state_dtype == weight_dtype else f32  # the products' dtype (the contract's)
    load_taps = _load_taps(T, V=V, W=W, weight_dtype=weight_dtype, pd=pd)
    store_x = _store_vector(T, V=V, dtype=x_dtype)
    token_out = _token_out(T, V=V, W=W, pd=pd, silu=silu, state_dtype=state_dtype, x_dtype=x_dtype, via_state=True)

    @T.macro
    def load_token(xa, win, c, t, i):  # token t into the window's slot i (x rounded to the pool's dtype first)
        for v in T.vectorized(V):
            win[i * V + v] = T.cast(T.cast(xa[c + v, t], state_dtype), pd)

    D, tokens, S, K, nq, nb, ns, ni = T.dynamic("D, tokens, S, K, nq, nb, ns, ni")
    x0, x1, o0, o1, w0, w1, s0, s1, s2 = T.dynamic("x0, x1, o0, o1, w0, w1, s0, s1, s2", i64)
    bs, qs, ss, is_ = T.dynamic("bs, qs, ss, is_", i64)

    def start_of(qsl, i):  # query_start_loc[i] clamped into the tokens
        return T.min(T.max(T.cast(qsl[i], i64), 0), T.cast(tokens, i64))

    @T.prim_func
    def conv1d_fn(
        x: T.StridedTensor((D, tokens), _layout(T, V, (x0, x1), 0), x_dtype),
        out: T.StridedTensor((D, tokens), _layout(T, V, (o0, o1), 0), x_dtype),
        weight: _weights(T, V, W, D, weight_dtype, w0, w1),
        bias: T.StridedTensor((nb,), _layout(T, V, (bs,), 0), bias_dtype),
        state: T.StridedTensor((S, D, K), _layout(T, V, (s0, s1, s2), 1), state_dtype),
        qsl: T.StridedTensor((nq,), (qs,), qsl_dtype),
        slots: T.StridedTensor((ns,), (ss,), slot_dtype),
        init: T.StridedTensor((ni,), (is_,), "bool"),
        pad_id: T.int64,
        null_id: T.int64,
    ):
        xa, oa, sa = _aligned(T, V, x, 0), _aligned(T, V, out, 0), _aligned(T, V, state, 1)
        with T.Kernel(T.ceildiv(tokens, BT), T.ceildiv(D, TH * V), threads=TH) as (bx, by):
            if W <= 4:
                T.annotate_min_blocks_per_sm(PREFILL_THREADS_PER_SM // TH)
            tx = T.get_thread_binding()
            win = T.alloc_local(((W - 1 + G) * V,), pd)  # token i of the window at i * V
            wk = T.alloc_local((W * V,), pd)  # tap j at j * V
            rb = T.alloc_local((V,), f32)
            acc = T.alloc_local((V,), f32)
            prod = T.alloc_local((V,), pd)
            rx = T.alloc_local((V,), x_dtype)
            rs = T.alloc_local((V,), state_dtype)
            lo = T.alloc_var(i64)
            hi = T.alloc_var(i64)
            first = T.alloc_var(i64)
            last = T.alloc_var(i64)
            slot = T.alloc_var(i64)
            c = (by * TH + tx) * V
            t0 = T.cast(bx * BT, i64)
            t1 = T.min(t0 + BT, T.cast(tokens, i64))
            batch = T.cast(nq - 1, i64)

            if c + V <= D:
                load_taps(weight, wk, c, D)
                for v in T.unroll(V):
                    rb[v] = T.cast(bias[c + v], f32) if has_bias else T.float32(0.0)
                for v in T.unroll(V):
                    rx[v] = T.cast(0, x_dtype)
                z0 = T.max(start_of(qsl, batch), t0)
                for t in T.serial(T.max(t1 - z0, 0)):  # tokens past the last sequence
                    store_x(oa, rx, (), c, z0 + t)
                # first / last: the last sequence starting at or before t0 / t1 - 1 (a non-empty one holds it)
                # binary-search steps: the batch's bit length (32 unrolled steps cost ~500 instructions a CTA)
                steps = 32 - T.call_extern("int32", "__clz", nq - 1)
                lo = 0
                hi = batch
                for _ in T.serial(steps):
                    if hi - lo > 1:
                        if start_of(qsl, (lo + hi) // 2) <= t0:
                            lo = (lo + hi) // 2
                        else:
                            hi = (lo + hi) // 2
                first = lo
                lo = first
                hi = batch
                for _ in T.serial(steps):
                    if hi - lo > 1:
                        if start_of(qsl, (lo + hi) // 2) <= t1 - 1:
                            lo = (lo + hi) // 2
                        else:
                            hi = (lo + hi) // 2
                last = lo
                for bi in T.serial(last - first + 1):
                    b = first + bi
                    s = start_of(qsl, b)
                    e = T.max(start_of(qsl, b + 1), s)
                    slot = T.cast(slots[b], i64) if has_slots else b
                    live = slot >= 0 and slot < T.cast(S, i64) and slot != pad_id
                    if has_null:
                        live = live and slot != null_id
                    with_init = live and init[b] if has_init else False
                    # this CTA's tokens of the sequence: a sequence's first W - 1 belong to the CTA holding its first
                    t_lo = T.if_then_else(s >= t0, s, T.max(t0, s + (W - 1)))
                    t_hi = T.if_then_else(s >= t0, T.min(T.max(t1, s + (W - 1)), e), T.min(t1, e))
                    n = T.max(t_hi - t_lo, 0)
                    if live:
                        for k in T.unroll(W - 1):  # the window before t_lo: x, the initial state or zeros
                            tok = t_lo - (W - 1) + k
                            for v in T.unroll(V):
                                win[k * V + v] = T.cast(0, pd)
                            if tok >= s:
                                for v in T.vectorized(V):
                                    rx[v] = xa[c + v, tok]
                                for v in T.unroll(V):
                                    win[k * V + v] = T.cast(T.cast(rx[v], state_dtype), pd)
                            elif with_init:
                                for v in T.vectorized(V):
                                    rs[v] = sa[slot, c + v, (W - 1) + tok - s]
                                for v in T.unroll(V):
                                    win[k * V + v] = T.cast(rs[v], pd)
                        for gi in T.serial(n // G):  # the window: W - 1 tokens, then the group's
                            t = t_lo + gi * G
                            for u in T.unroll(G):  # the loads first: G in flight
                                load_token(xa, win, c, t + u, W - 1 + u)
                            for u in T.unroll(G):
                                token_out(win, wk, rb, acc, prod, rx, u)
                                store_x(oa, rx, (), c, t + u)
                            for k in T.unroll(W - 1):
                                for v in T.vectorized(V):
                                    win[k * V + v] = win[(k + G) * V + v]
                        for r in T.serial(n % G):  # the last tokens one by one
                            t = t_lo + n // G * G + r
                            load_token(xa, win, c, t, W - 1)
                            token_out(win, wk, rb, acc, prod, rx, 0)
                            store_x(oa, rx, (), c, t)
                            for k in T.unroll(W - 1):
                                for v in T.vectorized(V):
                                    win[k * V + v] = win[(k + 1) * V + v]
                    else:  # a pad or null slot: zeros
                        for v in T.unroll(V):
                            rx[v] = T.cast(0, x_dtype)
                        for ti in T.serial(n):
                            store_x(oa, rx, (), c, t_lo + ti)
                    if live and s >= t0 and e > s:  # the final state, by the CTA of the first token
                        n_seq = e - s
                        for i in T.unroll(W - 1):
                            p = n_seq - (W - 1) + i
                            if p >= 0:
                                for v in T.vectorized(V):
                                    rx[v] = xa[c + v, s + p]
                                for v in T.unroll(V):
                                    rs[v] = T.cast(rx[v], state_dtype)
                            elif with_init:
                                for v in T.vectorized(V):
                                    rs[v] = sa[slot, c + v, i + n_seq]
                            else:
                                for v in T.unroll(V):
                                    rs[v] = T.cast(0, state_dtype)
                            for v in T.vectorized(V):
                                sa[slot, c + v, i] = rs[v]

    return conv1d_fn


def vector_width(*dtypes: str, nbytes: int = 16) -> int:
    """Channels per thread of the vector form: ``nbytes`` (8 or 16) of the widest of ``dtypes``."""
    if nbytes not in (8, 16):
        raise ValueError(f"nbytes: expected 8 or 16, got {nbytes!r}")
    return max(1, nbytes // max(_BYTES[d] for d in dtypes))


_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

__all__ = ["BLOCK_T", "MAX_WIDTH", "THREADS", "UPDATE_GROUPS", "VEC", "conv1d_fn_kernel", "conv1d_update_kernel",
           "vector_width"]  # fmt: skip
