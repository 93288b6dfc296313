"""The pipeline that TensorRT and TensorRT-RTX share: parse → configure → build → serialize.

Both modules expose the same builder API (Builder, OnnxParser, BuilderConfig, optimization
profiles). The backends differ only in how the module is loaded and how a target is selected,
which they supply through ``TrtFamilyBackend.select_target``.
"""

from __future__ import annotations

import functools
import time
from abc import abstractmethod
from pathlib import Path
from types import ModuleType
from typing import Any

import onnx

from enginefarm.core.directwrite import write_hashed
from enginefarm.core.domain import ANONYMOUS_DIMS, EngineDescriptor, HardwareCompat, Target
from enginefarm.core.errors import BuildFailed, SpecInvalid
from enginefarm.core.probe.machineprobe import MachineProbe
from enginefarm.core.spec import BuildSpec, Precision
from enginefarm.measure.modules import load_module
from worker.backends.base import BuildBackend, BuildLog
from worker.rewrite.onnxgraph import INLINE_LIMIT, save_model

# Without strong typing, precision is a set of builder flags; Q/DQ models also allow fp16 fallback.
PRECISION_FLAGS: dict[Precision, tuple[str, ...]] = {
    Precision.FP32: (),
    Precision.FP16: ("FP16",),
    Precision.BF16: ("BF16",),
    Precision.INT8: ("INT8", "FP16"),
    Precision.FP8: ("FP8", "FP16"),
}


def make_logger(trt: ModuleType, log: BuildLog):
    """A TensorRT ILogger that keeps the tail of the builder's messages in ``log``."""
    ilogger: Any = trt.ILogger  # a class of the module loaded at run time

    class _Logger(ilogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity, msg) -> None:
            if severity <= trt.ILogger.Severity.INFO:
                log.add(f"[{getattr(severity, 'name', severity)}] {msg}")

    return _Logger()


def fp16_graph(model_path: Path, spec: BuildSpec, out_dir: Path, log: BuildLog) -> Path:
    """The mixed fp16/fp32 graph a strongly typed fp16 build parses (worker/rewrite/fp16/ says what stays fp32)."""
    from worker.rewrite.fp16 import fp16_model

    out = out_dir / "model.fp16.onnx"
    try:
        report = fp16_model(
            model_path,
            out,
            keep_fp32_op_types=spec.keep_fp32_ops,
            keep_fp32_nodes=spec.keep_fp32_layers,
            keep_io_types=spec.keep_io_types,
        )
    except SpecInvalid as exc:  # a keep_fp32_layers name the graph does not have: the user's to fix
        raise BuildFailed(exc.message) from None
    log.add(report.summary())
    for note in report.notes:
        log.add(f"fp16: {note}")
    return out


def distinct_anonymous_dims(model_path: Path, out_dir: Path, log: BuildLog) -> Path:
    """TensorRT reads two dims with the same name as one dim, so exports that call every unknown dim ``?`` (older
    Paddle exports) get contradictory profiles ("Input dimensions with this name have different constant values").
    Such names mean "unknown", each its own: give each a distinct name. Returns the model to parse."""
    model = onnx.load(str(model_path), load_external_data=False)
    count = 0
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        if value.type.WhichOneof("value") != "tensor_type":
            continue
        for dim in value.type.tensor_type.shape.dim:
            if dim.WhichOneof("value") == "dim_param" and dim.dim_param.strip() in ANONYMOUS_DIMS - {""}:
                dim.dim_param = f"unknown_dim_{count}"
                count += 1
    if not count:
        return model_path
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        onnx.load_external_data_for_model(model, str(model_path.parent))
    out = out_dir / "model.dims.onnx"
    save_model(model, out, external=model.ByteSize() > INLINE_LIMIT)
    log.add(f"renamed {count} anonymous dims ('?') to distinct names: TensorRT would read equal names as one dim")
    return out


def network_from_onnx(trt: ModuleType, builder, model_path: Path, strongly_typed: bool, logger):
    """Parse the ONNX file into a network; parser errors become BuildFailed with every message."""
    flags = 0
    if strongly_typed and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    # parse_from_file reads external data relative to the model's directory.
    if not parser.parse_from_file(str(model_path)):
        errors = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        raise BuildFailed("the ONNX parser rejected the model: " + "; ".join(errors or ["no message"]))
    return network, parser


def _parser_error(err) -> str:
    where = ""
    for attr in ("node_name", "node_operator"):
        value = getattr(err, attr, None)
        if callable(value) and value():
            where += f"{value()} "
    return f"{where.strip()}: {err.desc()}" if where else err.desc()


def config_from_spec(trt: ModuleType, builder, network, spec: BuildSpec, strongly_typed: bool, log: BuildLog):
    """A BuilderConfig carrying the spec's profiles, workspace, optimization level and compat levels."""
    config = builder.create_builder_config()
    if spec.workspace_mib:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, spec.workspace_mib << 20)
    config.builder_optimization_level = spec.optimization_level
    for profile_spec in spec.normalized_profiles():
        profile = builder.create_optimization_profile()
        for name, rng in profile_spec.items():
            profile.set_shape(name, tuple(rng.min), tuple(rng.opt), tuple(rng.max))
        config.add_optimization_profile(profile)
    if spec.hardware_compatibility is not HardwareCompat.NONE:
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, spec.hardware_compatibility.name)
    if spec.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    if not strongly_typed:
        for flag in PRECISION_FLAGS[spec.precision]:
            if not hasattr(trt.BuilderFlag, flag):
                raise BuildFailed(f"precision {spec.precision.value} is not supported by this builder (no {flag} flag)")
            config.set_flag(getattr(trt.BuilderFlag, flag))
    log.add(
        f"config: precision={spec.precision.value} profiles={len(spec.normalized_profiles())} "
        f"opt_level={spec.optimization_level} hw_compat={spec.hardware_compatibility.value} "
        f"version_compatible={spec.version_compatible} strongly_typed={strongly_typed}"
    )
    return config


def engine_from_network(builder, network, config, out_path: Path, log: BuildLog) -> tuple[str, int]:
    """Build and write the serialized engine, around the page cache where the file system allows
    (``core.directwrite``); returns its sha256 and size. None from the builder is a model error."""
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        errors = [line for line in log.lines if line.startswith("[ERROR]") or line.startswith("[INTERNAL_ERROR]")]
        cause = errors[-1] if errors else "unsupported layer, shape or precision, or out of memory; see the log tail"
        raise BuildFailed(f"the builder produced no engine: {cause}")
    data = memoryview(plan)
    return write_hashed(out_path, data), data.nbytes


class TrtFamilyBackend(BuildBackend):
    """parse → configure → build → serialize, for any module with TensorRT's builder API."""

    module_name: str
    always_strongly_typed = False

    def module(self) -> ModuleType:
        return load_module(self.module_name)

    def version(self) -> str:
        return self.module().__version__

    @abstractmethod
    def select_target(
        self, trt: ModuleType, config, target: Target, machine: MachineProbe | None, log: BuildLog
    ) -> None:
        """Point the config at ``target``, or raise TargetUnavailable."""

    @abstractmethod
    def describe(self, target: Target, spec: BuildSpec, machine: MachineProbe | None) -> EngineDescriptor:
        """The engine's compatibility facts (without sha256 and size)."""

    def prepare_timing_cache(
        self, trt: ModuleType, config, target: Target, machine: MachineProbe | None, log: BuildLog
    ):
        """Attach a shared timing cache; returns a callback that saves it after the build, or None."""
        return None

    def build(
        self,
        model_path: Path,
        spec: BuildSpec,
        target: Target,
        out_path: Path,
        log: BuildLog,
        machine: MachineProbe | None,
    ) -> EngineDescriptor:
        trt = self.module()
        model_path = distinct_anonymous_dims(model_path, out_path.parent, log)
        strongly_typed = self.always_strongly_typed or spec.strongly_typed
        if strongly_typed and spec.precision is Precision.BF16:
            # Strongly typed builders take types from the graph; we only convert to fp16 ourselves.
            raise BuildFailed("bf16 with a strongly typed build needs a model whose tensors are already bf16")
        if strongly_typed and spec.precision is Precision.FP16:
            model_path = fp16_graph(model_path, spec, out_path.parent, log)
        logger = make_logger(trt, log)
        builder = trt.Builder(logger)
        started = time.perf_counter()
        network, _parser = network_from_onnx(trt, builder, model_path, strongly_typed, logger)
        config = config_from_spec(trt, builder, network, spec, strongly_typed, log)
        self.select_target(trt, config, target, machine, log)
        save_cache = self.prepare_timing_cache(trt, config, target, machine, log) if spec.timing_cache else None
        sha256, size = engine_from_network(builder, network, config, out_path, log)
        if save_cache is not None:
            save_cache(config)
        log.add(f"built {target} in {time.perf_counter() - started:.2f} s")
        descriptor = self.describe(target, spec, machine)
        descriptor.sha256, descriptor.size = sha256, size  # hashed as written: the file is not read again
        return descriptor


@functools.cache
def cuda_major_of(dist_prefix: str) -> str | None:
    """The CUDA major a TensorRT wheel was built for, from its distribution name (``tensorrt_rtx_cu13`` → "13").
    Once per process: it reads every installed distribution's metadata (8-15 ms), and a worker's wheels do not
    change under it."""
    from importlib.metadata import distributions

    for dist in distributions():
        name = (dist.metadata["Name"] or "").lower().replace("-", "_")
        if name.startswith(dist_prefix + "_cu") and name[len(dist_prefix) + 3 :].split("_")[0].isdigit():
            return name[len(dist_prefix) + 3 :].split("_")[0]
    return None
