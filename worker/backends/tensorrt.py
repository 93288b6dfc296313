"""NVIDIA's full TensorRT: builds on, and for, the GPU the worker runs on.

Its libraries install only from NVIDIA's own index, so the module is imported lazily and a
worker without it reports BackendMissing instead of failing at start.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from types import ModuleType

from filelock import FileLock

from enginefarm.core.config import get_settings
from enginefarm.core.domain import Backend, EngineDescriptor, Target
from enginefarm.core.errors import TargetUnavailable
from enginefarm.core.probe.machineprobe import MachineProbe
from enginefarm.core.spec import BuildSpec
from worker.backends.base import BuildLog
from worker.backends.trt_common import TrtFamilyBackend, cuda_major_of


def _gpu_for(target: Target, machine: MachineProbe | None):
    """The local GPU (or Jetson) whose compute capability is the target's."""
    if machine is None:
        return None
    for gpu in machine.gpus:
        if gpu.compute_capability == target.compute_capability:
            return gpu
    if machine.jetson and machine.jetson.compute_capability == target.compute_capability:
        return machine.jetson
    return None


class TensorRTBackend(TrtFamilyBackend):
    backend = Backend.TENSORRT
    module_name = "tensorrt"

    def select_target(
        self, trt: ModuleType, config, target: Target, machine: MachineProbe | None, log: BuildLog
    ) -> None:
        gpu = _gpu_for(target, machine)
        if gpu is None:
            raise TargetUnavailable(
                f"{target}: full TensorRT builds only for the GPU it runs on, and this worker "
                f"has no GPU of compute capability {target.compute_capability}"
            )
        log.add(f"target: {getattr(gpu, 'name', None) or gpu.model} (compute capability {target.compute_capability})")

    def _cache_path(self, target: Target, machine: MachineProbe | None) -> Path:
        gpu = _gpu_for(target, machine)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", getattr(gpu, "name", "") or getattr(gpu, "model", "gpu"))
        return get_settings().data_dir / "timing-caches" / f"trt-{self.version()}-{name}.cache"

    def prepare_timing_cache(
        self, trt: ModuleType, config, target: Target, machine: MachineProbe | None, log: BuildLog
    ):
        """One timing cache per TensorRT version and GPU model, shared by every build on this machine."""
        path = self._cache_path(target, machine)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path) + ".lock")
        with lock:
            data = path.read_bytes() if path.exists() else b""
        cache = config.create_timing_cache(data)
        config.set_timing_cache(cache, False)
        log.add(f"timing cache: {path.name} ({len(data)} bytes loaded)")

        def save(cfg) -> None:
            with lock:  # merge with what other builds wrote meanwhile, then replace atomically
                if path.exists():
                    cache.combine(cfg.create_timing_cache(path.read_bytes()), False)
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cache-")
                with os.fdopen(fd, "wb") as fh:
                    fh.write(memoryview(cache.serialize()))
                os.replace(tmp, path)

        return save

    def describe(self, target: Target, spec: BuildSpec, machine: MachineProbe | None) -> EngineDescriptor:
        gpu = _gpu_for(target, machine)
        cuda = cuda_major_of("tensorrt")
        cc = target.compute_capability  # every TensorRT architecture is an smXY: it has one
        return EngineDescriptor(
            target=str(target),
            backend=self.backend.value,
            backend_version=self.version(),
            precision=spec.precision.value,
            platform=self.host_platform(),
            compute_capability=target.compute_capability,
            compute_capabilities=[cc] if cc is not None else [],
            gpu_name=getattr(gpu, "name", None) or getattr(gpu, "model", None),
            trt_version=self.version(),
            cuda_version=(
                machine.cuda_version if machine and machine.cuda_version else (f"{cuda}.0" if cuda else None)
            ),
            driver_version=machine.driver_version if machine else None,
            hardware_compat=spec.hardware_compatibility.value,
            version_compatible=spec.version_compatible,
        )
