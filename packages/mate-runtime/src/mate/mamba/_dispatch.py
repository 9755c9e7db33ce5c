"""The one door between the public functions and the backends: run, prewarm, plan.

Every public function of ``mate.mamba`` reaches a backend through this module only. A backend is a module with
the same entry points for every op (``"ssu"``, ``"ssd"``, ``"replay"``, ``"materialize"``):

* ``run(op, call, sources)`` -> ``(result, launcher)``: runs a normalised call; ``launcher`` (or None) replays it
  for new tensors of the same metadata (``launcher(tensors) -> result``), built from the plan this very call made;
* ``prewarm(op, device, config)`` and ``plan(op, call)`` (TileLang only: the reference compiles nothing).

``"tilelang"`` serves CUDA/MUSA tensors where TileLang is installed, ``"torch"`` (the pure-PyTorch reference)
everything else. The backends are imported on first use, so ``import mate.mamba`` never imports TileLang.

The eager fast path (:class:`FastPath`, one per op): validation depends only on metadata (shapes, strides,
dtypes, devices, which arguments are None, the scalar options), never on tensor data, so a call whose metadata
equals an earlier call's skips normalisation, planning and backend choice and runs the launcher the earlier call
left. The reference backend leaves none (it checks index data on every call), nor does a TileLang call made with
``MATE_CHECK_INPUTS=1``; such metadata is remembered as slow so it is not analysed twice.

A call of the same form as the latest hit (a model's layers share one) is recognised without building its key: the
form's scalars compare equal and ``torch.compile``'s own tensor guard (``TensorGuards``, C++: exact class, dispatch
keys, dtype, device index, shape, strides, requires_grad of every tensor; about a third of the key's cost) accepts
its tensors. The guard checks more than the key, never less, so a guard miss only falls back to the key.
"""

from __future__ import annotations

import functools
import importlib.util
import linecache

import torch
from mate.mamba._contract.errors import bad_arg
from mate.mamba._platform.device import default_accelerator, is_accelerator

BACKENDS = ("auto", "tilelang", "torch")


@functools.cache
def tilelang_installed() -> bool:
    """Whether TileLang can be imported, checked without importing it (``import mate.mamba`` stays light)."""
    return importlib.util.find_spec("tilelang") is not None


def resolve_backend(requested: str, device: torch.device) -> str:
    if requested not in BACKENDS:
        bad_arg("backend", requested, f"one of {BACKENDS}")
    if requested == "torch":
        return "torch"
    usable = is_accelerator(device) and tilelang_installed()
    if requested == "auto":
        return "tilelang" if usable else "torch"
    if not is_accelerator(device):
        raise NotImplementedError(
            f"backend='tilelang' runs on CUDA or MUSA tensors, not on {device}; use backend='torch' or 'auto'"
        )
    if not tilelang_installed():
        raise ModuleNotFoundError(
            "backend='tilelang' needs TileLang: pip install 'mate-runtime[cuda]' (NVIDIA) or tilelang-musa (MUSA)"
        )
    return "tilelang"


def backend(name: str):
    """The backend module ``name`` (``"torch"`` or ``"tilelang"``), imported on first use."""
    if name == "tilelang":
        from mate.mamba._tilelang import backend as tilelang_backend

        return tilelang_backend
    from mate.mamba._reference import backend as reference_backend

    return reference_backend


def run(op: str, call, requested: str = "auto"):
    """Run a normalised call on the backend ``requested`` resolves to; returns the op's result."""
    return _run(op, call, requested, None)[0]


def _run(op: str, call, requested: str, sources):
    return backend(resolve_backend(requested, device_of(call))).run(op, call, sources)


def device_of(call) -> torch.device:
    """The device a normalised call runs on: its state pool's (the prefill's: its tokens')."""
    t = getattr(call, "state", None)
    return (call.x if t is None else t).device


def plan(op: str, call) -> tuple:
    """The kernel specs the TileLang backend launches for a normalised call, in launch order (nothing compiled or
    launched; TileLang need not be installed)."""
    return backend("tilelang").plan(op, call)


def prewarm(op: str, **config) -> None:
    """Compile the TileLang kernels of one serving configuration of ``op`` (arguments validated by the caller)
    on this machine's accelerator; nothing to do without one or without TileLang."""
    device = default_accelerator()
    if device is None or not tilelang_installed():
        return
    backend("tilelang").prewarm(op, device, config)


# ---------------------------------------------------------------------------------------- the eager fast path


class FastPath:
    """The eager entry of one op: call metadata -> the launcher an earlier call with that metadata left.

    Called as ``fast(tensors, scalars, args)`` by the op table's split entry (``mate.mamba._ops.OpTable.entry``):
    the keyed tensors in table order, and either the scalar options (every scalar of its exact class, every
    unimplemented option None: the call can be keyed) or, for a call that cannot be keyed, the whole argument
    tuple (the normaliser then decides: a truthy int is valid but not keyed; an unimplemented option raises)."""

    SLOW = "slow"  # a remembered key whose calls take the slow path (reference backend, no launcher)

    def __init__(self, op: str, table, normalize, *, size: int = 1024):
        self.op, self.table, self.normalize = op, table, normalize
        self.size = size  # metadata keys remembered (oldest dropped first): batch sizes x call forms
        self.enabled = True  # False: every call normalises (the behaviour before the fast path; benchmarks)
        self.cache: dict = {}
        self._guards: dict = {}  # key -> the form's tensor guard (None: the key alone decides)
        self._guarded = _guard_args(op, len(table.tensor_names))
        self._last: tuple = (None, None, None, None)  # (scalars, guard, launcher, key) of the latest hit

    def clear(self) -> None:
        """Forget every remembered call metadata (the next call of each form takes the slow path again)."""
        self.cache.clear()
        self._guards.clear()
        self._last = (None, None, None, None)

    def __call__(self, tensors: tuple, scalars: tuple | None, args: tuple | None):
        key = None
        if scalars is not None:
            if self.enabled:
                last = self._last
                if scalars == last[0] and last[1] is not None and last[1].check(*self._guarded(tensors)):
                    return last[2](tensors)
                key = fast_key(tensors, scalars)
                if key is not None:
                    if key == last[3]:
                        if last[1] is not None:  # the guard refused what the key accepts
                            self._last = (scalars, self._reguard(key, tensors), last[2], key)
                        return last[2](tensors)
                    launcher = self.cache.get(key)
                    if launcher is not None:
                        if launcher is not self.SLOW:
                            self._last = (scalars, self._guards.get(key), launcher, key)
                            return launcher(tensors)
                        key = None
            args = self.table.join(tensors, scalars)
        call = self.normalize(*args[:-1])
        sources = None if key is None else dict(zip(self.table.tensor_names, tensors, strict=True))
        result, launcher = _run(self.op, call, args[-1], sources)
        if key is not None:
            if len(self.cache) >= self.size:
                old = next(iter(self.cache), None)
                self.cache.pop(old, None)
                self._guards.pop(old, None)
            self.cache[key] = self.SLOW if launcher is None else launcher
            if launcher is not None:
                self._guards[key] = self._guard(tensors)
        return result

    def _guard(self, tensors: tuple):
        """The tensor guard of a form from one call's tensors, or None where it refuses them (one tensor passed
        in two places: TensorGuards never accepts a repeated object) or where torch has none."""
        if _TensorGuards is None:
            return None
        guarded = self._guarded(tensors)
        guard = _TensorGuards(*guarded, dynamic_dims_sizes=None, dynamic_dims_strides=None)
        return guard if guard.check(*guarded) else None

    def _reguard(self, key, tensors: tuple):
        """A form's guard made again from a call it refused although the key is equal (the guard also checks
        requires_grad and the dispatch keys under the current TLS, e.g. ``inference_mode``)."""
        guard = self._guards[key] = self._guard(tensors)
        return guard


try:  # torch.compile's guard of tensor metadata (torch/csrc/dynamo/guards.cpp)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # the key alone
    _TensorGuards = None


class _Absent(torch.Tensor):
    """The class of the stand-ins for an absent (None) tensor in a guard's arguments: the guard checks each
    argument's exact class, which no caller's tensor has."""


def _guard_args(op: str, n: int):
    """``guarded(tensors)``: the keyed tensors with each None replaced by its position's own stand-in (a guard
    takes only tensors and refuses one object in two places). Generated: a call pays no loop."""
    names = {f"_a{i}": torch.Tensor._make_subclass(_Absent, torch.empty(0)) for i in range(n)}
    items = ", ".join(f"_a{i} if t[{i}] is None else t[{i}]" for i in range(n))
    src = f"def guarded(t):\n    return ({items},)\n"
    filename = f"<mate.mamba._dispatch guarded {op}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), names)  # our own source, nothing from outside
    return names["guarded"]


def fast_key(tensors: tuple, scalars: tuple, _tensor=torch.Tensor, _parameter=torch.nn.Parameter):
    """The metadata key of a call, or None when a value cannot be keyed exactly (the call is then not cached): a
    tensor subclass other than ``nn.Parameter``, or a non-tensor where a tensor belongs.

    Per tensor: shape, strides, dtype and device index; the first tensor's full device adds the device type (every
    tensor of a valid call is on one device). Storage offsets are left out on purpose: no validation reads them,
    the pointer alignment they feed is re-checked by the launchers per call, and views are rebuilt relative to the
    new tensor's own offset."""
    first = tensors[0]
    cls = first.__class__
    if cls is not _tensor and cls is not _parameter:
        return None
    key = [scalars, first.device]
    append = key.append
    for t in tensors:
        if t is None:
            append(None)
            continue
        cls = t.__class__
        if cls is not _tensor and cls is not _parameter:
            return None
        append((t.shape, t.stride(), t.dtype, t.get_device()))
    return tuple(key)


__all__ = ["BACKENDS", "FastPath", "backend", "device_of", "fast_key", "plan", "prewarm", "resolve_backend", "run",
           "tilelang_installed"]  # fmt: skip
