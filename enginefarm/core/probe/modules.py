"""Which backend modules import here, at which version, and why one does not."""

from __future__ import annotations

import importlib

from enginefarm.core.domain import BACKEND_MODULES, Backend
from enginefarm.core.probe.gpus import error_text

TRT_MODULE = BACKEND_MODULES[Backend.TENSORRT]


RTX_MODULE = BACKEND_MODULES[Backend.TENSORRT_RTX]


ORT_MODULE = BACKEND_MODULES[Backend.ONNXRUNTIME]


LEAN_MODULE = "tensorrt_lean"  # the lean runtime only runs engines, so it is not a backend


def import_version(name: str) -> tuple[str | None, str | None]:
    """Return (version, None) when ``name`` imports, else (None, why)."""
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - OSError/RuntimeError from a native library is as fatal as ImportError
        return None, error_text(exc)
    return str(getattr(module, "__version__", "") or "unknown"), None


def probe_modules() -> tuple[dict[str, str | None], dict[str, str]]:
    """Return ({module: version or None}, {module: why it did not import}) for every backend module."""
    versions: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    for name in BACKEND_MODULES.values():
        versions[name], err = import_version(name)
        if err is not None:
            errors[name] = err
    return versions, errors
