"""A stand-in for ``torchvision`` on the CPU machines that run ``nox -s engines``, and nothing else.

SGLang 0.5.23 imports ``torchvision.transforms`` at module level in its multimodal config helpers
(``sglang/srt/multimodal/internvl_utils.py``, reached from ``sglang.srt.configs``, which its Mamba mixer imports),
and transformers imports ``torchvision.transforms.functional`` where it finds one. No torchvision on PyPI imports
beside the pinned CPU build of torch (its compiled operators fail to load: ``operator torchvision::nms does not
exist``), and the Mamba paths under test never call it. So every ``torchvision`` name resolves to a placeholder that
raises if it is ever called: a test that reached image code would fail, not pass silently.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+mate.cpu.shim"


class _Placeholder:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError("torchvision is a stand-in on this machine (tools/engines/cpu_shims)")

    def __getattr__(self, name):
        return _Placeholder()

    def __mro_entries__(self, bases):  # `class X(torchvision.something):` at import time
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every ``torchvision.*`` submodule as a placeholder module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder()
