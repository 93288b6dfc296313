"""ONNX Runtime's CUDA execution provider on this machine: whether it loads, and with which CUDA and cuDNN.

Kept apart from the probe because it loads native libraries (several hundred MB, once per process), and imports
nothing but the standard library: onnxruntime itself is imported lazily.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import io
from pathlib import Path

ORT_MODULE = "onnxruntime"

ORT_CUDA_PROVIDER = "CUDAExecutionProvider"
# The provider options the GPU worker chooses by measurement (enginefarm.measure.ort_cuda_runner.SessionChoice) and an
# engine carries as its ``run_options``: each "0" or "1".
RUN_OPTION_KEYS = ("prefer_nhwc", "enable_cuda_graph")


def known_run_options(options: object) -> dict[str, str]:
    """Of an engine's ``run_options`` (from a farm's answer: anything), the known keys with "0" or "1" only."""
    if not isinstance(options, dict):
        return {}
    return {k: v for k, v in options.items() if k in RUN_OPTION_KEYS and v in ("0", "1")}


def _cudnn_version() -> str | None:
    """The cuDNN that this process loads (91900 -> "9.19.0"), or None without one."""
    for name in ("libcudnn.so.9", "libcudnn.so"):
        try:
            v = int(ctypes.CDLL(name).cudnnGetVersion())
        except (OSError, AttributeError):
            continue
        return (
            f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000 else f"{v // 1000}.{v % 1000 // 100}.{v % 100}"
        )
    return None


@functools.lru_cache(maxsize=1)
def probe_ort_cuda() -> tuple[str | None, str | None, str | None]:
    """(CUDA version of ONNX Runtime's build, cuDNN version, why not) for ONNX Runtime's CUDA execution provider.

    Listing the provider is not enough: onnxruntime-gpu lists it even where CUDA's libraries are missing, and then
    falls back to the CPU at session creation with only a warning. So the provider's library is loaded here, after
    ``preload_dlls`` found CUDA and cuDNN in the ``nvidia-*`` wheels; a missing library is named in the reason.
    Cached per process: it loads several hundred MB of libraries once."""
    try:
        ort = importlib.import_module(ORT_MODULE)
    except Exception as exc:  # noqa: BLE001 - an import that fails in any way means no ONNX Runtime to use
        return None, None, str(exc) or type(exc).__name__
    if ORT_CUDA_PROVIDER not in ort.get_available_providers():
        return (
            None,
            None,
            f"onnxruntime {ort.__version__} has no {ORT_CUDA_PROVIDER} (that is the onnxruntime-gpu package)",
        )
    info = importlib.import_module(f"{ORT_MODULE}.capi.build_and_package_info")
    cuda = getattr(info, "cuda_version", None) or None
    if preload := getattr(ort, "preload_dlls", None):
        with contextlib.redirect_stdout(io.StringIO()):  # it prints its warnings
            try:
                preload()
            except Exception:  # noqa: BLE001 - the load below says what is missing
                pass
    library = Path(str(ort.__file__)).parent / "capi" / "libonnxruntime_providers_cuda.so"
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return None, None, f"{ORT_CUDA_PROVIDER} does not load: {exc}"
    return cuda or "unknown", _cudnn_version(), None
