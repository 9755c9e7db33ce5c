"""Lazy resolution of the MATE runtime, with an error that says whether MATE is missing or broken."""

from __future__ import annotations

_MAMBA = None


def mate_mamba():
    """``mate.mamba`` (the public entry points, eager and traced), imported on the first call and cached."""
    global _MAMBA
    if _MAMBA is not None:
        return _MAMBA
    try:
        import mate
        import mate.mamba
    except ModuleNotFoundError as e:
        if e.name is not None and (e.name == "mate" or e.name.startswith("mate.")):
            raise ImportError(
                "mate-flashinfer-compat: the MATE runtime is not installed (no module 'mate'); "
                "pip install mate-runtime==0.1.0"
            ) from e
        raise ImportError(f"mate-flashinfer-compat: the MATE runtime is installed but broken: {e!r}") from e
    except Exception as e:  # noqa: BLE001  (a broken install can fail in any way)
        raise ImportError(f"mate-flashinfer-compat: the MATE runtime is installed but broken: {e!r}") from e
    version = getattr(mate, "__version__", None)
    if version != "0.1.0":
        raise ImportError(
            f"mate-flashinfer-compat 0.1.0 needs mate-runtime 0.1.0, found {version!r} at {mate.__file__}"
        )
    _MAMBA = mate.mamba
    return _MAMBA
