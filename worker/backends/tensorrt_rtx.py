"""TensorRT for RTX: compiles engines ahead of time, without a GPU, for a chosen compute capability."""

from __future__ import annotations

from types import ModuleType

from enginefarm.core.domain import RTX_PORTABLE_CCS, Backend, EngineDescriptor, Target
from enginefarm.core.probe.machineprobe import MachineProbe
from enginefarm.core.spec import BuildSpec
from worker.backends.base import BuildLog
from worker.backends.trt_common import TrtFamilyBackend, cuda_major_of


class TensorRTRTXBackend(TrtFamilyBackend):
    backend = Backend.TENSORRT_RTX
    module_name = "tensorrt_rtx"
    # TensorRT-RTX networks are always strongly typed: precision comes from the graph's types.
    always_strongly_typed = True

    def select_target(
        self, trt: ModuleType, config, target: Target, machine: MachineProbe | None, log: BuildLog
    ) -> None:
        if target.arch == "portable":
            log.add(f"target: portable engine for compute capabilities {', '.join(RTX_PORTABLE_CCS)}")
            return
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, target.arch.upper()), 0)
        log.add(f"target: compute capability {target.compute_capability} (ahead of time, no GPU needed)")

    def prepare_timing_cache(
        self, trt: ModuleType, config, target: Target, machine: MachineProbe | None, log: BuildLog
    ):
        log.add(
            "timing cache: not used, TensorRT-RTX picks kernels at run time (its runtime cache lives on the GPU "
            "machine)"
        )
        return None

    def describe(self, target: Target, spec: BuildSpec, machine: MachineProbe | None) -> EngineDescriptor:
        version = self.version()
        cuda = cuda_major_of("tensorrt_rtx")
        cc = target.compute_capability  # None for "portable", the one architecture that is not an smXY
        return EngineDescriptor(
            target=str(target),
            backend=self.backend.value,
            backend_version=version,
            precision=spec.precision.value,
            platform=self.host_platform(),
            compute_capability=target.compute_capability,
            compute_capabilities=list(RTX_PORTABLE_CCS) if cc is None else [cc],
            trt_version=version,
            cuda_version=f"{cuda}.0" if cuda else None,
            hardware_compat=spec.hardware_compatibility.value,
            version_compatible=spec.version_compatible,
        )
