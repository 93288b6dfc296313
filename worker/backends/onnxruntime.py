"""ONNX Runtime on the CPU: an offline graph-optimized model for the worker's CPU architecture.

It is both the CPU target and the numeric reference for the accuracy checks.

The artifact is one self-contained .onnx file. ONNX Runtime writes an optimized model whose untouched weights
still point at the external data files of the model it read (a bundle's ``weights.bin``), which the artifact
does not carry: those weights are brought into the file (``self_contained``). One protobuf message holds at most
2 GiB, so a model larger than that with its weights cannot be an ONNX Runtime artifact, and its build fails
saying so (build it for a TensorRT target). Every artifact is loaded by ONNX Runtime from its bytes alone before
it is stored (``check_loadable``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from enginefarm.core.domain import Backend, EngineDescriptor, Target
from enginefarm.core.errors import BuildFailed, TargetUnavailable
from enginefarm.core.probe.machineprobe import MachineProbe
from enginefarm.core.spec import BuildSpec, Precision
from enginefarm.measure.modules import load_module
from enginefarm.measure.ort_runner import optimization_level
from worker.backends.base import BuildBackend, BuildLog
from worker.backends.trt_common import fp16_graph
from worker.rewrite.onnxgraph import INLINE_LIMIT, all_tensors, save_model


def _external(model) -> list:
    from onnx.external_data_helper import uses_external_data

    return [t for t in all_tensors(model) if uses_external_data(t)]


def self_contained(path: Path, base_dir: Path) -> int:
    """Bring into the model at ``path`` the weights it reads from external data files in ``base_dir`` (the folder of
    the model it was made from), so the file alone is the whole model; returns how many tensors moved in. Raises
    BuildFailed when the model and its weights are over what one .onnx file can hold (protobuf's 2 GiB)."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    model = onnx.load(str(path), load_external_data=False)
    external = _external(model)
    if not external:
        return 0
    load_external_data_for_model(model, str(base_dir))
    size = model.ByteSize()
    if size > INLINE_LIMIT:
        raise BuildFailed(
            f"the optimized model is {size} bytes with its weights, over the {INLINE_LIMIT} bytes one .onnx file can "
            f"hold (protobuf's 2 GiB limit): the ONNX Runtime target stores one self-contained file, so a model this "
            f"large cannot be built for it; build it for a TensorRT target, or in fp16 to halve its weights"
        )
    save_model(model, path, external=False)
    return len(external)


def check_loadable(path: Path) -> None:
    """Load the artifact with ONNX Runtime from its bytes alone, copied into a fresh folder with nothing beside it,
    as a deploy machine gets it. Raises BuildFailed (final) when it does not load: an artifact that cannot run is
    never stored."""
    import onnx

    ort = load_module("onnxruntime")
    with tempfile.TemporaryDirectory(prefix="enginefarm-ortcheck-") as tmp:
        alone = Path(tmp) / "model.onnx"
        shutil.copyfile(path, alone)
        try:
            # An absolute location would load here and nowhere else: an artifact reads no file at all.
            if named := [t.name for t in _external(onnx.load(str(alone), load_external_data=False))]:
                raise ValueError(
                    f"its tensors {', '.join(map(repr, named[:5]))} read external data files it does not carry"
                )
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # loading is the test
            ort.InferenceSession(str(alone), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - ORT's own error types, onnx's DecodeError: all mean the artifact is unusable
            raise BuildFailed(
                f"the built ONNX Runtime model does not load from its own bytes: {exc}; it was not stored"
            ) from None


class OnnxRuntimeBackend(BuildBackend):
    backend = Backend.ONNXRUNTIME

    def version(self) -> str:
        return load_module("onnxruntime").__version__

    def build(
        self,
        model_path: Path,
        spec: BuildSpec,
        target: Target,
        out_path: Path,
        log: BuildLog,
        machine: MachineProbe | None,
    ) -> EngineDescriptor:
        if target.is_ort_cuda:  # the CUDA provider's graph: worker/backends/onnxruntime_cuda.py
            from worker.backends.onnxruntime_cuda import build_cuda

            return build_cuda(model_path, spec, target, out_path, log, machine)
        ort = load_module("onnxruntime")
        if target.arch != f"cpu-{self.host_platform()}":
            # ORT_ENABLE_ALL applies layout transforms for the CPU it runs on: build on the target's arch.
            raise TargetUnavailable(f"{target}: this worker's CPU is {self.host_platform()}")
        if spec.precision is Precision.FP16:
            model_path = fp16_graph(model_path, spec, out_path.parent, log)
        options = ort.SessionOptions()
        options.graph_optimization_level, why = optimization_level(ort, model_path)
        options.optimized_model_filepath = str(out_path)
        try:
            ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types: all are model errors here
            raise BuildFailed(f"ONNX Runtime could not load the model: {exc}") from exc
        log.add(f"onnxruntime {ort.__version__}: graph optimized for {self.host_platform()} ({why})")
        if moved := self_contained(out_path, model_path.parent):
            log.add(f"weights of {moved} tensors moved from the model's external data into the artifact")
        return EngineDescriptor(
            target=str(target),
            backend=self.backend.value,
            backend_version=ort.__version__,
            precision=spec.precision.value,
            platform=self.host_platform(),
        )
