"""The ``gpu`` marker: tests that need an NVIDIA GPU and ONNX Runtime's CUDA provider.

They run where the probe finds both, or with ``--gpu`` (bench/gpu_matrix.sh runs them on a GPU machine). Anywhere
else they are deselected, never skipped, and the session ends by saying how many did not run and why.
"""

from __future__ import annotations

import pytest

GPU_KEY = pytest.StashKey[tuple[int, str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--gpu",
        action="store_true",
        default=False,
        help="run the tests marked gpu, which need an NVIDIA GPU and ONNX Runtime's CUDA provider",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU and onnxruntime-gpu; deselected on machines without")


def _why_not() -> str | None:
    """None where this machine runs the GPU tests, else why it does not."""
    from enginefarm.core.probe.machineprobe import probe_machine

    probe = probe_machine()
    if not probe.gpus:
        return f"no NVIDIA GPU found ({probe.nvml_error or 'none listed'})"
    if not probe.ort_cuda:
        return f"ONNX Runtime's CUDA provider is not usable ({probe.ort_cuda_error})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu or config.getoption("--gpu"):
        return
    why = _why_not()
    if why is None:
        return
    config.hook.pytest_deselected(items=gpu)
    items[:] = [item for item in items if not item.get_closest_marker("gpu")]
    config.stash[GPU_KEY] = (len(gpu), why)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if GPU_KEY in config.stash:
        count, why = config.stash[GPU_KEY]
        terminalreporter.write_line(
            f"{count} GPU test(s) not run: deselected, since {why}. They run on a machine with an NVIDIA GPU and "
            "onnxruntime-gpu (pytest --gpu; bench/gpu_matrix.sh runs them there).",
            yellow=True,
        )
