"""Post-import hooks for the adapters: run a callback right after a consumer's module executes.

The vLLM plugin and the SGLang hook patch a serving engine's registry and prefill op when the engine imports
those modules, so they never import the engine themselves. Each hook carries its owner's name, so one adapter
can drop its pending hooks without touching another's. Standard library only.
"""

from __future__ import annotations

import importlib.abc
import sys


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
        # also the modules that imported the replacement after it was patched (e.g. mid-import at patch time)
        for attr, original, replacement in self.functions:
            for m in list(sys.modules.values()):
                name = getattr(m, "__name__", "") or ""
                if name.startswith(self.prefix) and getattr(m, attr, None) is replacement:
                    setattr(m, attr, original)
        self.functions.clear()
        cancel(self.owner)


_ledgers: dict = {}


def ledger(owner: str, package_prefix: str) -> Patches:
    """``owner``'s one :class:`Patches` ledger, made on first use (each adapter records and restores through it)."""
    patches = _ledgers.get(owner)
    if patches is None:
        patches = _ledgers[owner] = Patches(owner, package_prefix)
    return patches
