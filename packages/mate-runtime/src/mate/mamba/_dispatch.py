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
form's scalars compare equal and its form check accepts the tensors: the form's absent arguments are None, a tensor
the form passed twice (vLLM's one slot table as source and destination) is again one object, and ``torch.compile``'s
own tensor guard (``TensorGuards``, C++: exact class, dispatch keys, dtype, device index, shape, strides,
requires_grad) accepts the others. The check is generated per form (no loop over the absent ones), and checks more
than the key, never less, so a refusal only falls back to the key.
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

    NONE = (None, None, None)  # no latest hit (scalars never compare equal to None)

    def __init__(self, op: str, table, normalize, *, size: int = 1024):
        self.op, self.table, self.normalize = op, table, normalize
        self.size = size  # metadata keys remembered (oldest dropped first): batch sizes x call forms
        self._enabled = True
        self.cache: dict = {}
        self._checks: dict = {}  # key -> the form's check (_refuse: the key alone decides)
        # (scalars, check, launcher) of the latest hit (the op's entry replays its form: OpTable.entry), its key
        self.latest, self._latest_key = self.NONE, None

    @property
    def enabled(self) -> bool:
        """False: every call normalises (the behaviour before the fast path; benchmarks)."""
        return self._enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._enabled = on
        self.latest, self._latest_key = self.NONE, None

    def clear(self) -> None:
        """Forget every remembered call metadata (the next call of each form takes the slow path again)."""
        self.cache.clear()
        self._checks.clear()
        self.latest, self._latest_key = self.NONE, None

    def __call__(self, tensors: tuple, scalars: tuple | None, args: tuple | None):
        key = None
        if scalars is not None:
            if self._enabled:
                latest = self.latest
                if scalars == latest[0] and latest[1](tensors):  # (the op's entry tests this first)
                    return latest[2](tensors)
                key = fast_key(tensors, scalars)
                if key is not None:
                    if key == self._latest_key:
                        if latest[1] is not _refuse:  # the check refused what the key accepts: made again
                            self.latest = (scalars, self._recheck(key, tensors), latest[2])
                        return latest[2](tensors)
                    launcher = self.cache.get(key)
                    if launcher is not None:
                        if launcher is not self.SLOW:
                            self.latest, self._latest_key = (scalars, self._checks[key], launcher), key
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
                self._checks.pop(old, None)
            self.cache[key] = self.SLOW if launcher is None else launcher
            if launcher is not None:
                self._checks[key] = form_check(tensors)
        return result

    def _recheck(self, key, tensors: tuple):
        """A form's check made again from a call it refused although the key is equal (the guard also checks
        requires_grad and the dispatch keys under the current TLS, e.g. ``inference_mode``)."""
        check = self._checks[key] = form_check(tensors)
        return check


def _refuse(tensors: tuple) -> bool:
    """The check of a form torch cannot guard: refuses every call (the key decides)."""
    return False


try:  # torch.compile's guard of tensor metadata (torch/csrc/dynamo/guards.cpp)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # the key alone
    _TensorGuards = None


def form_check(tensors: tuple):
    """``check(tensors) -> bool``: whether a call's tensors have the form of these (a call that built its key):
    None where these are None, one object where these repeat one, and the rest accepted by their tensor guard
    (which takes only tensors, each object once). :func:`_refuse` where torch has no guard or it refuses these."""
    if _TensorGuards is None:
        return _refuse
    first: dict = {}  # id -> the position of the object's first occurrence
    absent, guarded, repeats = [], [], []
    for i, t in enumerate(tensors):
        if t is None:
            absent.append(i)
        elif id(t) in first:
            repeats.append((i, first[id(t)]))
        else:
            first[id(t)] = i
            guarded.append(i)
    ts = [tensors[i] for i in guarded]
    guard = _TensorGuards(*ts, dynamic_dims_sizes=None, dynamic_dims_strides=None)
    if not guard.check(*ts):
        return _refuse
    return _check_maker(len(tensors), tuple(absent), tuple(guarded), tuple(repeats))(guard.check)


@functools.cache
def _check_maker(n: int, absent: tuple, guarded: tuple, repeats: tuple):
    """``make(guard) -> check`` of one arrangement of absent, guarded and repeated positions. Generated: the
    check pays no loop (a loop over a model's twenty-odd arguments costs more than the guard)."""
    terms = [f"_{i} is None" for i in absent] + [f"_{i} is _{j}" for i, j in repeats]
    terms.append(f"guard({', '.join(f'_{i}' for i in guarded)})")
    src = (
        "def make(guard):\n"
        "    def check(t):\n"
        f"        {', '.join(f'_{i}' for i in range(n))}, = t\n"
        f"        return {' and '.join(terms)}\n"
        "    return check\n"
    )
    filename = f"<mate.mamba._dispatch form check {n} {absent} {repeats}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    names: dict = {}
    exec(compile(src, filename, "exec"), names)  # our own source, nothing from outside
    return names["make"]


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


__all__ = ["BACKENDS", "FastPath", "backend", "device_of", "fast_key", "form_check", "plan", "prewarm",
           "resolve_backend", "run", "tilelang_installed"]  # fmt: skip
