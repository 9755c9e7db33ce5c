"""Every environment variable MATE reads, in one table: its name, its values, what it does.

MATE's kernels are chosen by the planners from the call alone; the variables here are the few things a user
really chooses: whether the SSU kernels use programmatic dependent launch, whether the kernels' index tables
are checked on the host (a debugging aid), where compiled kernels are cached, and whether (and where) each
adapter plugs MATE into its engine. Each is parsed once, on first use, by :func:`get`; a malformed value raises
``ValueError`` naming the variable and the values it takes.

The adapters' rows are theirs: each installed adapter declares its settings (:func:`declare`, through
``mate.mamba.adapters.Adapter``) and names them in the entry point group :data:`ADAPTERS`, from which the table
loads the rows of every installed adapter the first time it needs a row it does not hold, or all of them.

This module imports only the standard library: the adapters' start-up hooks (``.pth`` lines, run in every
interpreter) read their switches through it without importing torch.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

# The entry point group of the adapters: name, the adapter's distribution; object, a function returning the
# Setting rows it reads.
ADAPTERS = "mate.mamba.adapters"


@dataclass(frozen=True)
class Setting:
    """One environment variable: its parser maps the raw text (``default`` when unset or empty) to a value."""

    name: str
    default: str
    choices: tuple[str, ...] | None  # the accepted spellings (None: ``parse`` decides)
    help: str
    parse: Callable[[str], object] = str
    keep_case: bool = False  # a path: the raw text is not lower-cased before parsing


def names(raw: str) -> tuple[str, ...]:
    """A comma-separated list of names; ``none``, ``off`` or ``0`` is the empty tuple."""
    found = tuple(n.strip() for n in raw.split(",") if n.strip())
    return () if found in ((), ("none",), ("off",), ("0",)) else found


ON_OFF = ("0", "1", "false", "true", "no", "yes", "off", "on")


def on_off(raw: str) -> bool:
    """A switch spelled as one of :data:`ON_OFF`."""
    return raw in ("1", "true", "yes", "on")


CACHE_OFF = ("off", "none", "0")


def _cache_dir(raw: str) -> str | None:
    """The compiled-kernel cache directory: ``off`` / ``none`` / ``0`` is None (no disk cache); empty is
    ``$XDG_CACHE_HOME/mate``, else ``~/.cache/mate``; ``~`` and ``$VARS`` are expanded."""
    if raw.lower() in CACHE_OFF:
        return None
    if not raw:
        home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(home, "mate")
    return os.path.abspath(os.path.expanduser(os.path.expandvars(raw)))


# MATE's own rows; the adapters' join them through declare()
_ROWS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "MATE_SSU_PDL",
            "0",
            ("0", "1", "auto"),
            "Programmatic dependent launch for the selective-state-update kernels: 0 off (default), 1 on "
            "(NotImplementedError where the device cannot), auto on for CUDA compute capability 9.0 and newer. "
            "It lets a decode kernel launch while the previous kernel on the stream drains; it helps behind "
            "another kernel that triggers early and costs 0.2-0.4 us behind one that does not.",
        ),
        Setting(
            "MATE_CHECK_INPUTS",
            "0",
            ON_OFF,
            "1: the TileLang backend also checks the values of the index tables (cu_seqlens, the chunk tables, "
            "seq_idx, slot and buffer indices) on every call, as the reference backend always does. It copies "
            "them to the host (a device sync per call, skipped while a graph is being captured) and sends every "
            "decode call through the full path. A debugging aid; the kernels skip out-of-range entries either way.",
            on_off,
        ),
        Setting(
            "MATE_CACHE_DIR",
            "",
            None,
            "MATE's cache of compiled kernels (a directory; docs/startup.md): a kernel compiled once is loaded "
            "from there by every later process without re-lowering or re-compiling. Empty: $XDG_CACHE_HOME/mate, "
            "else ~/.cache/mate; off: no disk cache (compile in every process).",
            _cache_dir,
            keep_case=True,
        ),
    )
}


class _Table(Mapping[str, Setting]):
    """The settings by name. Iterating it, or asking for a name it does not hold, first declares the rows of
    every installed adapter (once per process)."""

    def __getitem__(self, name: str) -> Setting:
        if name not in _ROWS:
            _discover()
        return _ROWS[name]

    def __iter__(self) -> Iterator[str]:
        _discover()
        return iter(list(_ROWS))

    def __len__(self) -> int:
        _discover()
        return len(_ROWS)


SETTINGS: Mapping[str, Setting] = _Table()

_values: dict[str, object] = {}
_overrides: list[dict[str, object]] = []
_lock = threading.RLock()  # (re-entered: the first get() of an adapter's row may declare the adapters' rows)
_discovered = False


def declare(*rows: Setting) -> tuple[Setting, ...]:
    """Add an adapter's rows to the table and return them. Declaring a row again is a no-op; another row under
    a name already taken is a ``ValueError``."""
    with _lock:
        for row in rows:
            held = _ROWS.setdefault(row.name, row)
            if held != row:
                raise ValueError(f"{row.name}: declared as {row!r}, but the table holds {held!r}")
    return rows


def adapters() -> list:
    """The entry points of the installed adapters (group :data:`ADAPTERS`), by name; none is loaded."""
    from importlib.metadata import entry_points  # (here: importing it costs more than this whole module)

    return sorted(entry_points(group=ADAPTERS), key=lambda ep: ep.name)


def _discover() -> None:
    """Declare the rows of every installed adapter, once per process. An adapter whose declaration fails to
    load is left out (its own entry points say why when used)."""
    global _discovered
    with _lock:
        if _discovered:
            return
        _discovered = True
        for ep in adapters():
            try:
                declare(*ep.load()())
            except Exception:  # noqa: BLE001  (a broken adapter must not take MATE's own settings down)
                continue


def parse(name: str, raw: str | None) -> object:
    """The value of setting ``name`` for the raw text ``raw`` (None or blank: the default)."""
    s = SETTINGS[name]
    text = s.default if raw is None or not raw.strip() else raw.strip() if s.keep_case else raw.strip().lower()
    if s.choices is not None and text not in s.choices:
        raise ValueError(f"{name}={raw!r}: expected one of {', '.join(s.choices)} (default {s.default})")
    return s.parse(text)


def get(name: str) -> object:
    """The value of setting ``name``: an enclosing :func:`override`'s, else the environment's, read once."""
    for layer in reversed(_overrides):
        if name in layer:
            return layer[name]
    try:
        return _values[name]
    except KeyError:
        pass
    with _lock:
        if name not in _values:
            _values[name] = parse(name, os.environ.get(name))
        return _values[name]


@contextlib.contextmanager
def override(**values: str) -> Iterator[None]:
    """Within the block, read the settings named (by variable name) as if the environment said ``values``
    (tests and the benchmark compare settings in one process). Kernels already planned keep their choice."""
    layer = {name: parse(name, raw) for name, raw in values.items()}
    _overrides.append(layer)
    try:
        yield
    finally:
        _overrides.remove(layer)


def reset() -> None:
    """Forget the values read so far: the next :func:`get` reads the environment again."""
    with _lock:
        _values.clear()


def describe() -> list[tuple[str, str, str]]:
    """(name, value in force, help) of every setting, for ``mate-mamba info``."""
    rows = []
    for name, s in SETTINGS.items():
        try:
            value = str(os.environ.get(name) or s.default)
            parse(name, os.environ.get(name))
        except ValueError as exc:
            value = f"invalid ({exc})"
        rows.append((name, value, s.help))
    return rows


__all__ = [
    "ADAPTERS",
    "ON_OFF",
    "SETTINGS",
    "Setting",
    "adapters",
    "declare",
    "describe",
    "get",
    "names",
    "on_off",
    "override",
    "parse",
    "reset",
]
