"""Lazy resolution of the MATE runtime, with an error that says whether MATE is missing or broken."""

from __future__ import annotations

_OPS = None


def mate_ops():
    """``mate._ops`` (the dual eager/traced entries), imported on the first call and cached."""
    global _OPS
    if _OPS is not None:
        return _OPS
    try:
        from mate import _ops
    except ModuleNotFoundError as e:
        if e.name is not None and (e.name == "mate" or e.name.startswith("mate.")):
            raise ImportError("mate-sglang: the MATE runtime is not installed; pip install mate-runtime==0.1.0") from e
        raise ImportError(f"mate-sglang: the MATE runtime is installed but broken: {e!r}") from e
    except Exception as e:  # noqa: BLE001  (a broken install can fail in any way)
        raise ImportError(f"mate-sglang: the MATE runtime is installed but broken: {e!r}") from e
    _OPS = _ops
    return _ops
