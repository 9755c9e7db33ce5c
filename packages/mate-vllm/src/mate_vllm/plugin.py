"""The vLLM plugin: ``vllm.general_plugins`` entry point ``mate = mate_vllm.plugin:register``.

vLLM calls :func:`register` in every process it starts. It does nothing unless ``MATE_VLLM_ENABLE=1``; then:

* **SSU backend.** vLLM selects its decode kernel through ``_BACKEND_REGISTRY`` in
  ``vllm/model_executor/layers/mamba/ops/ssu_dispatch.py`` (``MambaSSUBackend`` subclasses keyed by
  ``MambaBackendEnum``, i.e. by ``--mamba-backend``). The enum is closed, so MATE takes over the entries named
  in ``MATE_VLLM_SSU_BACKENDS`` (default ``triton,flashinfer``: whichever GPU backend is configured, MATE serves
  it) plus a ``mate`` entry when the enum has one. ``MATE_VLLM_SSU_BACKENDS=none`` leaves the registry alone.
* **Prefill.** ``mamba_chunk_scan_combined_varlen`` in ``.../ops/ssd_combined.py`` (and every vLLM module that
  imported it by name) becomes :func:`mate_vllm.ops.mamba_chunk_scan_combined_varlen`, unless
  ``MATE_VLLM_PREFILL=0``.

* **ReplaySSM.** vLLM's ``--use-replayssm`` decode bypasses the SSU registry. On the FlashInfer backend it calls
  ``ssu_dispatch._flashinfer_replayssm_kernel`` (FlashInfer's ``checkpointing_ssu``). Each time
  ``initialize_mamba_ssu_backend(..., use_replayssm=True)`` sets it, ``MATE_VLLM_REPLAYSSM=auto`` (the default)
  routes each call to MATE's ``replay_state_update`` where the measured rule (:mod:`mate_vllm.replay_rule`) names
  the call's state dtype, tokens per step, batch and head shape, to FlashInfer's kernel elsewhere (the rule is
  logged once); ``1`` serves every call with MATE's, ``0`` leaves FlashInfer's. On the Triton backend (another
  ring contract), and under ``0``, the decode stays vLLM's, with one warning per process; the prefill is MATE's
  either way.

* **Gated RMSNorm.** With ``MATE_VLLM_NORM=1``, ``rms_norm_gated`` in ``.../ops/layernorm_gated.py`` (and the
  mixer module that imports it by name) becomes :func:`mate_vllm.ops.rms_norm_gated`: what
  ``Mixer2RMSNormGated.forward_cuda`` calls for a layer of one group at TP 1, the same arithmetic. A layer that
  runs vLLM's PyTorch ``forward_native`` instead (several groups, a TP split, or the op disabled, as under vLLM's
  default Inductor compilation) stays vLLM's (two roundings, or an all-reduce across ranks), with one warning per
  process.

* **Causal conv1d.** With ``MATE_VLLM_CONV1D=1``, ``causal_conv1d_fn`` and ``causal_conv1d_update`` in
  ``.../ops/causal_conv1d.py`` (and every vLLM module that imported them by name) become
  :func:`mate_vllm.ops.causal_conv1d_fn` / :func:`~mate_vllm.ops.causal_conv1d_update` (the same signatures and
  results). A call form MATE refuses with ``NotImplementedError`` runs vLLM's own function, with one warning per
  reason. With ``auto`` (the default) only ``causal_conv1d_update`` is rebound, to
  :func:`~mate_vllm.ops.causal_conv1d_update_auto`: MATE's for one-token calls of at least
  ``ops.CONV1D_UPDATE_MIN_BATCH`` sequences (where it was measured faster), vLLM's for the rest.

The patches apply when the vLLM module is imported (immediately if it already is), so the plugin itself
imports nothing from vLLM. Written against vLLM 0.33.0: another version gets a warning when ``vllm`` is imported,
and a module that lacks the expected names or signatures gets a warning naming what is missing and is left
untouched. :func:`unregister` restores what was replaced.
"""

from __future__ import annotations

import inspect
import sys
import warnings

from ._adapter import (
    CONV1D_AUTO,
    ENV_CONV1D,
    ENV_ENABLE,
    ENV_NORM,
    ENV_PREFILL,
    ENV_REPLAYSSM,
    ENV_REPLAYSSM_RULE,
    ENV_SSU,
    adapter,
)

SSU_DISPATCH = "vllm.model_executor.layers.mamba.ops.ssu_dispatch"
SSD_COMBINED = "vllm.model_executor.layers.mamba.ops.ssd_combined"
LAYERNORM_GATED = "vllm.model_executor.layers.mamba.ops.layernorm_gated"
MAMBA_MIXER2 = "vllm.model_executor.layers.mamba.mamba_mixer2"
CAUSAL_CONV1D = "vllm.model_executor.layers.mamba.ops.causal_conv1d"

SSU_CALL_PARAMS = (
    "state", "x", "dt", "A", "B", "C", "D", "dt_bias", "z", "dt_softplus", "state_batch_indices",
    "dst_state_batch_indices", "null_block_id", "out", "num_accepted_tokens", "cu_seqlens", "is_blackwell",
)  # fmt: skip
PREFILL_PARAMS = (
    "x", "dt", "A", "B", "C", "chunk_size", "cu_seqlens", "cu_chunk_seqlens", "last_chunk_indices", "seq_idx",
    "out", "D", "z", "dt_bias", "initial_states", "dt_softplus", "dt_limit", "return_intermediate_states",
    "state_dtype", "final_states_out", "final_state_indices",
)  # fmt: skip


# ------------------------------------------------------------------------------------------------ SSU


def make_backend_class(base, null_block_id=0):
    """A ``MambaSSUBackend`` subclass (vLLM's ABC, passed in) that serves vLLM's backend call with MATE."""
    from . import ops

    class MateSSUBackend(base):
        """MATE's selective_state_update behind vLLM's SSU backend interface (vLLM's Triton semantics)."""

        def __init__(self, mamba_config):
            super().__init__(mamba_config)
            # --enable-mamba-cache-stochastic-rounding and its Philox rounds, as vLLM's Triton backend reads them
            self._sr = bool(getattr(mamba_config, "enable_stochastic_rounding", False))
            self._sr_rounds = getattr(mamba_config, "stochastic_rounding_philox_rounds", 0) or 0

        @property
        def name(self) -> str:
            return "mate"

        def __call__(
            self,
            state,
            x,
            dt,
            A,
            B,
            C,
            D,
            dt_bias,
            z=None,
            dt_softplus=False,
            state_batch_indices=None,
            dst_state_batch_indices=None,
            null_block_id=null_block_id,
            out=None,
            num_accepted_tokens=None,
            cu_seqlens=None,
            is_blackwell=False,
        ):
            ops.selective_state_update(
                state, x, dt, A, B, C, D, dt_bias, z=z, dt_softplus=dt_softplus,
                state_batch_indices=state_batch_indices, dst_state_batch_indices=dst_state_batch_indices,
                null_block_id=null_block_id, out=out, num_accepted_tokens=num_accepted_tokens, cu_seqlens=cu_seqlens,
                is_blackwell=is_blackwell, enable_stochastic_rounding=self._sr, cache_philox_rounds=self._sr_rounds,
            )  # fmt: skip

    return MateSSUBackend


def _patch_ssu_dispatch(sd) -> None:
    a = adapter()
    registry = getattr(sd, "_BACKEND_REGISTRY", None)
    base = getattr(sd, "MambaSSUBackend", None)
    if not isinstance(registry, dict) or not registry or not inspect.isclass(base):
        a.state["ssu"] = "skipped: no _BACKEND_REGISTRY / MambaSSUBackend"
        a.warn(
            f"{sd.__name__} has no _BACKEND_REGISTRY dict / MambaSSUBackend class (a vLLM version this plugin does "
            "not know); the MATE SSU backend is not registered"
        )
        return
    params = tuple(inspect.signature(base.__call__).parameters)[1:]
    if params != SSU_CALL_PARAMS:
        a.state["ssu"] = "skipped: MambaSSUBackend.__call__ signature differs"
        a.warn(
            f"vLLM's MambaSSUBackend.__call__ takes {params}, expected {SSU_CALL_PARAMS}; the MATE SSU backend is "
            "not registered"
        )
        return
    cls = make_backend_class(base, getattr(sd, "NULL_BLOCK_ID", 0))
    key_type = type(next(iter(registry)))
    done = []
    for name in ["mate", *a.setting(ENV_SSU)]:
        try:
            key = key_type(name)
        except (ValueError, KeyError, TypeError):
            if name != "mate":
                a.warn(f"{ENV_SSU}: vLLM has no mamba backend named {name!r}; valid: {[str(k) for k in registry]}")
            continue
        a.ledger.set_entry(registry, name, key, cls)
        done.append(name)
    current = getattr(sd, "_mamba_ssu_backend", None)
    if current is not None and not isinstance(current, cls):
        a.warn(
            f"vLLM's SSU backend was already initialised ({type(current).__name__}) before the plugin ran; it keeps "
            "serving this process"
        )
    a.state["ssu"] = f"registered for {done}" if done else "skipped: no matching backend names"


# -------------------------------------------------------------------------------------------- prefill


def _patch_ssd_combined(mod) -> None:
    from . import ops

    a = adapter()
    orig = getattr(mod, "mamba_chunk_scan_combined_varlen", None)
    if orig is None or not callable(orig):
        a.state["prefill"] = "skipped: no mamba_chunk_scan_combined_varlen"
        a.warn(f"{mod.__name__} has no mamba_chunk_scan_combined_varlen; the prefill is not routed to MATE")
        return
    if orig is ops.mamba_chunk_scan_combined_varlen:
        return
    try:
        params = tuple(inspect.signature(orig).parameters)
    except (TypeError, ValueError):
        params = ()
    if params != PREFILL_PARAMS[: len(params)] or len(params) < PREFILL_PARAMS.index("state_dtype") + 1:
        a.state["prefill"] = "skipped: signature differs"
        a.warn(
            f"vLLM's mamba_chunk_scan_combined_varlen takes {params}, which is not a prefix of {PREFILL_PARAMS}; the "
            "prefill is not routed to MATE"
        )
        return
    patched = a.ledger.rebind(mod, "mamba_chunk_scan_combined_varlen", orig, ops.mamba_chunk_scan_combined_varlen)
    a.state["prefill"] = f"routed in {patched}"


# ------------------------------------------------------------------------------------------ ReplaySSM


def _patch_replayssm(sd) -> None:
    """Serve vLLM's ``--use-replayssm`` decode on the FlashInfer backend as ``MATE_VLLM_REPLAYSSM`` says: ``auto``
    (default) each call by the measured rule (:mod:`mate_vllm.replay_rule`), ``1`` MATE's op for every call, ``0``
    FlashInfer's kernel for every call.

    That decode bypasses the SSU registry: the mixer calls ``selective_state_update_replayssm_flashinfer``,
    which calls the module global ``_flashinfer_replayssm_kernel`` with FlashInfer's ``checkpointing_ssu``
    arguments and then keeps the ring trackers itself. ``initialize_mamba_ssu_backend`` sets that global on every
    call, so right after it returns the global becomes :func:`mate_vllm.ops.checkpointing_ssu` (``1``), or a router
    between it and FlashInfer's kernel (``auto``, where the rule names a cell for MATE); vLLM's reshaping, scratch
    and tracker bookkeeping stay vLLM's. The Triton backend's ReplaySSM
    (``selective_state_update_replayssm_output_only``, a linear buffer flushed on the host's schedule: another
    contract) stays vLLM's with one warning, and so does the FlashInfer one under ``0``. Under ``auto`` the rule
    is logged once (logger ``mate_vllm``, INFO)."""
    import functools
    import logging

    from . import ops, replay_rule

    a = adapter()
    orig = getattr(sd, "initialize_mamba_ssu_backend", None)
    if orig is None or "use_replayssm" not in inspect.signature(orig).parameters:
        a.state["replayssm"] = "skipped: no initialize_mamba_ssu_backend(use_replayssm=...)"
        a.warn(
            f"{sd.__name__} has no initialize_mamba_ssu_backend(..., use_replayssm=); --use-replayssm is not watched"
        )
        return
    if "_flashinfer_replayssm_kernel" not in vars(sd):
        a.warn(f"{sd.__name__} has no _flashinfer_replayssm_kernel; --use-replayssm stays vLLM's")

    def left_to_vllm(why: str) -> None:
        if a.state["replayssm"] != "left to vLLM":
            a.state["replayssm"] = "left to vLLM"
            a.warn(f"--use-replayssm: the Mamba decode runs vLLM's own ReplaySSM kernel ({why}); the prefill is "
                   "still MATE's")  # fmt: skip

    @functools.wraps(orig)
    def initialize_mamba_ssu_backend(*args, **kwargs):
        orig(*args, **kwargs)
        if not kwargs.get("use_replayssm"):
            return
        flashinfer = getattr(sd, "_flashinfer_replayssm_kernel", None)
        mode = a.setting(ENV_REPLAYSSM)
        if flashinfer is None:
            left_to_vllm("the Triton backend's ReplaySSM keeps a linear buffer on the host's schedule, a contract "
                         "MATE does not serve")  # fmt: skip
        elif mode == "mate":
            a.ledger.set_attr(sd, "_flashinfer_replayssm_kernel", ops.checkpointing_ssu)
            a.state["replayssm"] = "served by MATE (FlashInfer's checkpointing_ssu contract)"
        elif mode == "flashinfer":
            left_to_vllm(f"{ENV_REPLAYSSM}=0; auto serves the calls where MATE's kernel is measured faster, 1 all")
        else:
            rule = replay_rule.load(a.setting(ENV_REPLAYSSM_RULE))
            if rule.cells:
                a.ledger.set_attr(sd, "_flashinfer_replayssm_kernel", ops.routed_checkpointing_ssu(flashinfer, rule))
            said = rule.describe()
            if a.state["replayssm"] != said:
                a.state["replayssm"] = said
                logging.getLogger("mate_vllm").info("--use-replayssm: %s", said)

    a.ledger.rebind(sd, "initialize_mamba_ssu_backend", orig, initialize_mamba_ssu_backend)
    a.state["replayssm"] = "watched"


# ------------------------------------------------------------------------------------------ gated norm

NORM_PARAMS = ("x", "weight", "bias", "z", "eps", "group_size", "norm_before_gate")


def _patch_norm(mod) -> None:
    from . import ops

    a = adapter()
    orig = getattr(mod, "rms_norm_gated", None)
    if orig is ops.rms_norm_gated:
        return
    try:
        params = tuple(inspect.signature(orig).parameters)
    except (TypeError, ValueError):
        params = ()
    if params != NORM_PARAMS:
        a.state["norm"] = "skipped: signature differs"
        a.warn(f"vLLM's rms_norm_gated takes {params}, expected {NORM_PARAMS}; the gated norm is not routed to MATE")
        return
    a.state["norm"] = f"routed in {a.ledger.rebind(mod, 'rms_norm_gated', orig, ops.rms_norm_gated)}"


def left_to_vllm(norm) -> str | None:
    """Why a constructed ``Mixer2RMSNormGated`` runs vLLM's PyTorch code rather than the kernel MATE serves, or
    None where its forward calls ``rms_norm_gated`` (vLLM 0.33's ``forward_cuda``: one group, TP 1)."""
    if not getattr(norm, "use_rms_norm", True):
        return None  # no norm: the gate alone
    method = getattr(getattr(norm, "_forward_method", None), "__func__", None)
    if method is not None and method is not type(norm).forward_cuda:
        return f"the op runs {method.__name__} (vLLM's custom_ops leave it disabled, as under Inductor)"
    if norm.n_groups != 1 or norm.tp_size != 1:
        return f"{norm.n_groups} groups at TP {norm.tp_size} take forward_native"
    return None


def _watch_mixer2_norm(mod) -> None:
    """One warning per process for the first ``Mixer2RMSNormGated`` left to vLLM's PyTorch code."""
    import functools

    a = adapter()
    cls = getattr(mod, "Mixer2RMSNormGated", None)
    if cls is None or not inspect.isclass(cls):
        a.warn(f"{mod.__name__} has no Mixer2RMSNormGated; which gated norms MATE serves is not reported")
        return
    orig = cls.__init__
    warned = []

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        why = None if warned else left_to_vllm(self)
        if why is not None:
            warned.append(why)
            a.warn(f"the Mamba2 gated RMSNorm stays vLLM's PyTorch code ({why}; it rounds twice where vLLM's Triton "
                   "kernel and MATE round once); MATE serves its rms_norm_gated kernel calls only")  # fmt: skip

    a.ledger.set_attr(cls, "__init__", __init__)


# --------------------------------------------------------------------------------------------- conv1d

CONV1D_FN_PARAMS = (
    "x", "weight", "bias", "conv_states", "query_start_loc", "cache_indices", "has_initial_state", "activation",
    "pad_slot_id", "null_block_id", "metadata", "validate_data",
)  # fmt: skip
CONV1D_UPDATE_PARAMS = (
    "x", "conv_state", "weight", "bias", "activation", "conv_state_indices", "num_accepted_tokens", "query_start_loc",
    "max_query_len", "null_block_id", "validate_data", "out",
)  # fmt: skip


def _patch_conv1d(mod) -> None:
    """``causal_conv1d_fn`` / ``causal_conv1d_update`` in ``ops/causal_conv1d.py``, and in every vLLM module that
    imported them by name (the Mamba1/Mamba2 mixers, ShortConv, the GDN/KDA layers, ...), become MATE's
    (``MATE_VLLM_CONV1D=1``), or only the update becomes the measured rule's (``auto``). On vLLM's CPU platform the
    module binds its CPU functions (another signature), which stay vLLM's."""
    from . import ops

    a = adapter()
    auto = a.setting(ENV_CONV1D) == CONV1D_AUTO
    routes = {"causal_conv1d_update": ops.causal_conv1d_update_auto} if auto else {
        "causal_conv1d_fn": ops.causal_conv1d_fn, "causal_conv1d_update": ops.causal_conv1d_update}  # fmt: skip
    expected = {"causal_conv1d_fn": CONV1D_FN_PARAMS, "causal_conv1d_update": CONV1D_UPDATE_PARAMS}
    done = []
    ours = (ops.causal_conv1d_fn, ops.causal_conv1d_update, ops.causal_conv1d_update_auto)
    for name, mine in routes.items():
        bound = orig = getattr(mod, name, None)
        if bound is mine:
            done.append(name)
            continue
        if bound in ours:  # routed before in another mode: vLLM's own function is the one the ledger replaced
            orig = next((o for attr, o, r in a.ledger.functions if attr == name and r is bound), None)
        try:
            params = tuple(inspect.signature(orig).parameters)
        except (TypeError, ValueError):
            params = ()
        if params != expected[name]:
            a.warn(f"vLLM's {name} takes {params}, expected {expected[name]}; it is not routed to MATE")
            continue
        ops.ENGINE_CONV1D[name] = orig
        a.ledger.rebind(mod, name, bound, mine)
        done.append(name)
    users = sorted(
        m.__name__ for m in list(sys.modules.values())
        if (getattr(m, "__name__", "") or "").startswith("vllm.")
        and any(getattr(m, n, None) is routes[n] for n in done)
    )  # fmt: skip
    rule = f" (auto: MATE's for one token at batch >= {ops.CONV1D_UPDATE_MIN_BATCH}, else vLLM's)" if auto else ""
    a.state["conv1d"] = f"{done} routed in {users}{rule}" if done else "skipped: signatures differ"


# ---------------------------------------------------------------------------------------------- entry


def register() -> None:
    """The ``vllm.general_plugins`` entry point. A no-op unless ``MATE_VLLM_ENABLE=1``.

    A malformed value of one of its switches in ``mate.mamba.settings`` raises ``ValueError`` naming the variable (a
    typo must not leave vLLM's kernels serving silently); nothing else raises: a failure to patch warns and
    leaves vLLM as it is."""
    try:
        a = adapter()
        enabled = a.setting(ENV_ENABLE)
    except ImportError as e:  # no usable MATE runtime: nothing can be served
        warnings.warn(f"{e}; the plugin does nothing", stacklevel=2)
        return
    if not enabled:
        return
    for name in (
        ENV_SSU,
        ENV_PREFILL,
        ENV_REPLAYSSM,
        ENV_REPLAYSSM_RULE,
        ENV_NORM,
        ENV_CONV1D,
    ):  # a malformed value raises here, not later inside vLLM's imports
        a.setting(name)
    try:
        a.when_imported("vllm", a.check_version)
        a.when_imported(SSU_DISPATCH, _patch_ssu_dispatch)  # also registers a 'mate' key where one exists
        a.when_imported(SSU_DISPATCH, _patch_replayssm)
        if a.setting(ENV_PREFILL):
            a.when_imported(SSD_COMBINED, _patch_ssd_combined)
        if a.setting(ENV_NORM):
            a.when_imported(LAYERNORM_GATED, _patch_norm)
            a.when_imported(MAMBA_MIXER2, _watch_mixer2_norm)
        if a.setting(ENV_CONV1D) != "off":
            a.when_imported(CAUSAL_CONV1D, _patch_conv1d)
    except Exception as e:  # noqa: BLE001  (a plugin must never take vLLM down)
        a.warn(f"registration failed and was skipped: {e!r}")


def unregister() -> None:
    """Restore every registry entry and prefill function the plugin replaced, and drop pending hooks."""
    adapter().restore()


def status() -> dict:
    """What :func:`register` did in this process (None: the module was not imported yet, or disabled)."""
    return adapter().status()
