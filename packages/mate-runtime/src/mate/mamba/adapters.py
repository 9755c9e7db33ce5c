"""What MATE's adapters share: post-import hooks, the patch ledger, version checks, their settings and the
resolution of the runtime they serve.

An adapter (a distribution of its own that plugs MATE into a serving engine) patches the engine without
importing it: it arms a hook that runs right after the engine imports a module (:func:`when_imported`), replaces
a registry entry or a function there and records it in its ledger (:class:`Patches`), so that one call puts all
of it back. Each adapter describes itself once, as an :class:`Adapter`: its distribution and version, the engine
and the releases it was written against, and the settings it reads, which it declares in
:mod:`mate.mamba.settings` and names in the entry point group ``mate.mamba.adapters`` so that the settings table
and ``mate-mamba info`` list them while MATE names no adapter.

Standard library only at import, and an adapter loads :mod:`mate.mamba.settings` only when it reads a setting:
the adapters' start-up hooks (``.pth`` lines) import this module in every interpreter of an environment.
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys
import warnings

from mate.mamba._platform.version import __version__

# ----------------------------------------------------------------------------------------- post-import hooks


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` right after module ``name`` executes (before whoever imported it resumes)."""

    def __init__(self, name, callback, owner):
        self.name, self.callback, self.owner = name, callback, owner

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _AfterImport):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Wrapped(spec.loader, self)
                return spec
        return None


class _Wrapped(importlib.abc.Loader):
    def __init__(self, loader, hook):
        self.loader, self.hook = loader, hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        # every hook waiting for this module fires (two adapters, or two patches of one, may wait for the same
        # one), in the order they were armed; the first finder in sys.meta_path is the one that wrapped the loader
        hooks = [f for f in sys.meta_path if isinstance(f, _AfterImport) and f.name == self.hook.name]
        for f in hooks:
            sys.meta_path.remove(f)
        for f in reversed(hooks):
            f.callback(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


def when_imported(name: str, callback, owner: str) -> None:
    """``callback(module)`` once module ``name`` is imported: now if it already is, else right after it executes."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    sys.meta_path.insert(0, _AfterImport(name, callback, owner))


def cancel(owner: str) -> None:
    """Drop ``owner``'s hooks that have not fired yet."""
    sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, _AfterImport) and f.owner == owner)]


# ---------------------------------------------------------------------------------------------- the ledger


class Patches:
    """What one adapter replaced inside a serving engine (registry entries, a rebound function), so that
    :meth:`restore` puts all of it back and drops the adapter's pending hooks."""

    def __init__(self, owner: str, package_prefix: str):
        self.owner, self.prefix = owner, package_prefix
        self.entries: dict = {}  # (id(registry), name) -> (registry, key, previous value or None)
        self.functions: list = []  # (attribute, original, replacement)
        self.attributes: dict = {}  # (id(owner object), attribute) -> (owner object, attribute, original)

    def set_entry(self, registry, name, key, value) -> None:
        """``registry[key] = value``, remembering the first value it replaced."""
        self.entries.setdefault((id(registry), name), (registry, key, registry.get(key)))
        registry[key] = value

    def set_attr(self, obj, attr: str, value) -> None:
        """``obj.attr = value`` on one object (a class method, say), remembering the first value it replaced."""
        self.attributes.setdefault((id(obj), attr), (obj, attr, obj.__dict__.get(attr)))
        setattr(obj, attr, value)

    def rebind(self, module, attr: str, original, replacement) -> list[str]:
        """``module.attr = replacement``, and the same in every imported engine module that imported the
        original by name; returns the modules patched."""
        patched = []
        for m in list(sys.modules.values()):
            name = getattr(m, "__name__", "") or ""
            if (m is module or name.startswith(self.prefix)) and getattr(m, attr, None) is original:
                setattr(m, attr, replacement)
                patched.append(name)
        self.functions.append((attr, original, replacement))
        return patched

    def restore(self) -> None:
        for registry, key, prev in self.entries.values():
            if prev is None:
                registry.pop(key, None)
            else:
                registry[key] = prev
        self.entries.clear()
        for obj, attr, prev in self.attributes.values():
            if prev is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, prev)
        self.attributes.clear()
        # also the modules that imported the replacement after it was patched (e.g. mid-import at patch time);
        # the latest rebinding first, so a function rebound twice ends as the engine's own
        for attr, original, replacement in reversed(self.functions):
            for m in list(sys.modules.values()):
                name = getattr(m, "__name__", "") or ""
                if name.startswith(self.prefix) and getattr(m, attr, None) is replacement:
                    setattr(m, attr, original)
        self.functions.clear()
        cancel(self.owner)


# --------------------------------------------------------------------------------------------- the adapter


class Adapter:
    """One adapter: ``name`` its distribution (the prefix of its warnings and errors, the owner of its hooks and
    ledger) and ``version`` its release, which runs on the mate-runtime of the same version; ``package`` the
    engine's import name (the modules its ledger patches), ``engine`` and ``tested`` the engine's name and the
    releases the adapter was written against; ``settings`` a function returning the rows it reads (what its
    entry point names), declared in the settings table at its first read; ``status`` the keys of what it did,
    for :meth:`status` (None: not done, or not yet)."""

    def __init__(self, name, version, package, engine, tested, settings=tuple, status=()):
        if version != __version__:
            raise ImportError(
                f"{name} {version} needs mate-runtime {version}, found {__version__} at {os.path.dirname(__file__)}"
            )
        self.name, self.version, self.package, self.engine, self.tested = name, version, package, engine, tested
        self._undeclared = settings
        self.ledger = Patches(name, f"{package}.")
        self.state: dict = dict.fromkeys(status)
        self._mamba = None

    def warn(self, message: str) -> None:
        warnings.warn(f"{self.name}: {message}", stacklevel=3)

    def setting(self, name: str):
        """The value of a setting (:func:`mate.mamba.settings.get`)."""
        from mate.mamba import settings  # (here: a start-up hook that reads no setting does not import it)

        if self._undeclared is not None:
            settings.declare(*self._undeclared())
            self._undeclared = None
        return settings.get(name)

    def when_imported(self, module: str, patch) -> None:
        """``patch(engine module)`` once ``module`` is imported (now if it already is). It runs inside the engine's
        import, so it never raises there: a failure is a warning naming it, and the engine keeps its own code."""

        def run(mod) -> None:
            try:
                patch(mod)
            except Exception as e:  # noqa: BLE001  (a hook must never take the engine down)
                self.warn(f"{patch.__name__} failed and was skipped: {e!r}")

        when_imported(module, run, owner=self.name)

    def is_tested(self, version: str) -> bool:
        """Whether the engine's ``version`` is a release the adapter was written against (or a post or local
        build of one)."""
        return any(version == v or version.startswith((f"{v}.post", f"{v}+")) for v in self.tested)

    def engine_version(self, module) -> str:
        """The engine's version (``module.__version__``), recorded under ``version``."""
        version = self.state["version"] = str(getattr(module, "__version__", "unknown"))
        return version

    def check_version(self, module) -> str:
        """:meth:`engine_version`, with a warning where it is not a release the adapter was written against:
        MATE then serves only where the engine's registry and signatures match."""
        version = self.engine_version(module)
        if not self.is_tested(version):
            self.warn(
                f"{self.name} is tested against {self.engine} {', '.join(self.tested)}, found {version}: MATE is "
                f"registered where {self.engine}'s registry and signatures match, and each patch that does not "
                "match is skipped with a warning"
            )
        return version

    def status(self) -> dict:
        return dict(self.state)

    def restore(self) -> None:
        """Put back everything the ledger recorded, drop the pending hooks, forget the status."""
        self.ledger.restore()
        self.state.update(dict.fromkeys(self.state))

    def runtime(self):
        """``mate.mamba`` with its public functions loaded, on the first call; ``ImportError`` says whether the
        runtime is missing or broken."""
        if self._mamba is None:
            try:
                import mate.mamba

                for name in mate.mamba.__all__:
                    getattr(mate.mamba, name)
            except ModuleNotFoundError as e:
                if e.name is not None and (e.name == "mate" or e.name.startswith("mate.")):
                    raise ImportError(
                        f"{self.name}: the MATE runtime is not installed; pip install mate-runtime=={self.version}"
                    ) from e
                raise ImportError(f"{self.name}: the MATE runtime is installed but broken: {e!r}") from e
            except Exception as e:  # noqa: BLE001  (a broken install can fail in any way)
                raise ImportError(f"{self.name}: the MATE runtime is installed but broken: {e!r}") from e
            self._mamba = mate.mamba
        return self._mamba


# ------------------------------------------------------------------------- an engine op that two adapters serve


def mamba_chunk_scan_combined_varlen(
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    cu_seqlens,
    cu_chunk_seqlens,
    last_chunk_indices,
    seq_idx,
    out,
    D=None,
    z=None,
    dt_bias=None,
    initial_states=None,
    dt_softplus=False,
    dt_limit=(0.0, float("inf")),
    return_intermediate_states=False,
    state_dtype=None,
    final_states_out=None,
    final_state_indices=None,
):
    """vLLM 0.33's packed SSD prefill op (``vllm/model_executor/layers/mamba/ops/ssd_combined.py``) on
    ``mate.mamba.ssd_combined_fwd_varlen``: vLLM's name and positional order (``initial_states`` right after
    ``dt_bias``), ``out`` required and written in place, ``final_states_out`` / ``final_state_indices`` (the
    final states go straight into the state pool and None is returned), and vLLM's return dtype: ``state_dtype``,
    else ``C``'s (also beside fp32 ``initial_states``). Returns the final states ``[batch, H, P, N]``, or every
    chunk's end state with ``return_intermediate_states``.

    The vLLM adapter serves it inside vLLM and the FlashInfer-shaped package beside MATE's own prefill name;
    adapters do not import each other, so the one copy is here, where both reach it."""
    tensor, table_entry = _prefill_runtime()
    if out is None:
        raise ValueError("out: got None; expected a preallocated [tokens, heads, dim] tensor (written in place)")
    if state_dtype is None and isinstance(C, tensor):
        state_dtype = C.dtype  # vLLM: the states come back in C's dtype unless state_dtype says otherwise
    # mate.mamba.ssd_combined_fwd_varlen's parameters positionally (its options are keyword-only: binding them
    # costs ~0.7 us a call)
    return table_entry()(
        x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, out, D, z, dt_bias,
        dt_softplus, dt_limit, initial_states, return_intermediate_states, state_dtype,
        None, None, None,  # checkpoint_token_indices, checkpoint_state_slots, checkpoint_states
        final_states_out, final_state_indices,
        None, None,  # initial_states_scale, final_states_scale
        "auto",  # backend
    )  # fmt: skip


@functools.cache
def _prefill_runtime():
    """``(torch.Tensor, mate.mamba.ssd.table_entry)``, imported on the first prefill (importing this module imports
    no torch): a from-import on every call costs ~1.7 us on a 2-core CPU."""
    import torch
    from mate.mamba.ssd import table_entry

    return torch.Tensor, table_entry


__all__ = ["Adapter", "Patches", "cancel", "mamba_chunk_scan_combined_varlen", "when_imported"]
