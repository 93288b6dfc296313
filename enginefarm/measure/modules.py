"""Runtime modules (TensorRT, TensorRT-RTX, ONNX Runtime), imported once, on first use."""

from __future__ import annotations

import importlib
from types import ModuleType

from enginefarm.core.errors import BackendMissing

_modules: dict[str, ModuleType] = {}


def load_module(name: str) -> ModuleType:
    """Import a runtime module once; a machine without it gets BackendMissing saying so."""
    if name not in _modules:
        try:
            _modules[name] = importlib.import_module(name)
        except Exception as exc:
            raise BackendMissing(f"the {name} module is not importable on this machine: {exc}") from exc
    return _modules[name]
