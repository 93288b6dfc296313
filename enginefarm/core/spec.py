"""The build spec: what a build is asked for (precision, profiles, calibration, checks), validated as it arrives,
and its canonical hash (the same spec always hashes the same, whatever order its fields came in)."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from enginefarm.core.domain import HardwareCompat, StrEnum


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"
    FP8 = "fp8"


PRECISIONS: tuple[str, ...] = tuple(p.value for p in Precision)  # in the order help and forms list them


class GraphCleanup(StrEnum):
    NONE = "none"
    ONNXSLIM = "onnxslim"


class CalibrationMethod(StrEnum):
    MINMAX = "minmax"
    ENTROPY = "entropy"
    PERCENTILE = "percentile"


class CalibrationSpec(BaseModel):
    """How an int8 Q/DQ model is made from the uploaded samples. Percentile is the default: on the real-model corpus
    it matched or beat minmax on every model (PP-OCR recognizer cosine 0.965 against 0.944, docs/models.md), and
    entropy was the worst on the OCR models."""

    model_config = ConfigDict(extra="forbid")
    method: CalibrationMethod = CalibrationMethod.PERCENTILE
    batch: StrictInt = Field(default=1, ge=1, le=4096, description="samples per calibration batch")


# Spec numbers and flags are strict: a JSON true is not the number 1, nor "64" the number 64.
Dims = list[StrictInt]


class ShapeRange(BaseModel):
    """One input's min/opt/max dims within an optimization profile."""

    model_config = ConfigDict(extra="forbid")
    min: Dims
    opt: Dims
    max: Dims


MAX_DIM = 1 << 20
# TensorRT documents no limit on optimization profiles (tensorrt_rtx 1.7.1's builder config took 2,000), but each
# one is tuned on its own, so build time and engine size grow with every profile.
MAX_PROFILES = 32
CHECK_FIELDS = ("benchmark", "accuracy")
# How the project judges its engines' evidence: neither the engine nor how it is checked, so in neither hash.
POLICY_FIELDS = ("gate",)
# Spec fields that change the engine but came after the first catalogs: hashed only when not at their default.
LATER_FIELDS = (
    "keep_fp32_ops",
    "keep_fp32_layers",
    "keep_io_types",
    "graph_cleanup",
    "calibration",
    "fixed_inputs",
    "precision_fallback",
    "tf32",
    "accuracy_repair",
)
MAX_FIXED_ELEMENTS = 4096
# The shape key of a benchmark at the first optimization profile's opt shapes (the default measurement).
DEFAULT_SHAPE_KEY = "opt"


class BenchmarkSpec(BaseModel):
    """How each engine is benchmarked. The defaults are trtexec's; none of this changes the engine."""

    model_config = ConfigDict(extra="forbid")

    enabled: StrictBool = True
    warmup_ms: StrictInt = Field(default=200, ge=0, le=60_000, description="time-based warm-up before measuring")
    duration_s: StrictFloat = Field(default=3.0, ge=0.0, le=600.0, description="minimum measured duration")
    iterations: StrictInt = Field(default=10, ge=1, le=1_000_000, description="minimum measured iterations")
    shapes: list[dict[str, Dims]] = Field(
        default_factory=list,
        max_length=16,
        description="input shapes to measure at, each a full set; empty measures the profile's opt shapes",
    )
    batch_sizes: list[StrictInt] = Field(
        default_factory=list,
        max_length=16,
        description="shorthand for shapes: the opt shapes with axis 0 set to each size",
    )
    cuda_graph: StrictBool = Field(default=False, description="capture the inference in a CUDA graph (GPU engines)")
    threads: StrictInt | None = Field(default=None, ge=1, le=1024, description="ONNX Runtime intra-op threads (CPU)")
    value_ranges: dict[str, tuple[StrictFloat, StrictFloat]] = Field(
        default_factory=dict,
        max_length=1000,
        description="per input, the [low, high] range of generated values (Polygraphy's --val-range); without it, "
        "integer inputs that index a table stay within it and others take 0..1",
    )
    use_samples: StrictBool = Field(
        default=True,
        description="time on the model's uploaded samples where their shapes "
        "fit (trtexec's --loadInputs); else generated values",
    )

    @model_validator(mode="after")
    def _sizes(self) -> BenchmarkSpec:
        if any(b < 1 or b > MAX_DIM for b in self.batch_sizes):
            raise ValueError(f"batch_sizes must be within 1..{MAX_DIM}")
        if self.shapes and self.batch_sizes:
            raise ValueError("give either 'shapes' or 'batch_sizes', not both")
        for name, (low, high) in self.value_ranges.items():
            if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                raise ValueError(f"value_ranges[{name!r}]: need finite low <= high, got [{low}, {high}]")
        return self


# Figures an accuracy check computes, and whether a larger value is worse ("max") or better ("min").
# ``violations``: the fraction of float elements outside ``atol + rtol*|reference|``; ``agreement``: the fraction
# of integer or boolean elements equal to the reference.
ACCURACY_LIMITS = {
    "max_abs": "max",
    "mean_abs": "max",
    "rel_l2": "max",
    "cosine": "min",
    "violations": "max",
    "agreement": "min",
}
# Parameters of the elementwise check (not limits themselves).
ELEMENTWISE_PARAMS = frozenset({"atol", "rtol"})
# Figures that are fractions or a cosine: a limit above 1 could never be met.
AT_MOST_ONE = frozenset({"cosine", "violations", "agreement"})

# Default pass/fail limits per precision, against ONNX Runtime FP32 on the original model. Float precisions are
# gated elementwise as Polygraphy compares; quantized ones on cosine and relative L2, because their error scales
# with each tensor's range. The figures that chose them are in docs/models.md ("Accuracy gates"). fp32 lets 10
# elements in a million fall outside: an optimized graph's rounding near an output's exact zeros (4 of 1.23 million,
# 2.4e-4 off on outputs of about 30, in a depth network) is not an error; a wrong artifact puts far more outside.
DEFAULT_TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"atol": 1e-4, "rtol": 1e-3, "violations": 1e-5, "agreement": 1.0},
    "fp16": {"atol": 1e-2, "rtol": 1e-2, "violations": 5e-3, "agreement": 0.99},
    "bf16": {"atol": 5e-2, "rtol": 5e-2, "violations": 5e-3, "agreement": 0.98},
    "int8": {"cosine": 0.98, "rel_l2": 0.2, "agreement": 0.9},
    "fp8": {"cosine": 0.98, "rel_l2": 0.2, "agreement": 0.9},
}


class GateSpec(BaseModel):
    """What counts as an engine's evidence for this project's gate and resolve."""

    model_config = ConfigDict(extra="forbid")

    accept_fleet_checks: StrictBool = Field(
        default=False,
        description="a deploy machine's accuracy check (enginefarm measure) counts as the engine's verdict where "
        "the farm has none, and one that fails counts as a failure; off, they are only shown",
    )


class AccuracySpec(BaseModel):
    """How each engine's outputs are compared with ONNX Runtime FP32 on the original model."""

    model_config = ConfigDict(extra="forbid")

    enabled: StrictBool = True
    seed: StrictInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the random inputs (without samples)")
    batches: StrictInt = Field(default=2, ge=1, le=64, description="random input batches (without samples)")
    tolerances: dict[str, StrictFloat] = Field(
        default_factory=dict,
        description="limits overriding the precision's defaults: atol and rtol (the elementwise "
        "check |engine-ref| <= atol + rtol*|ref|), violations (the fraction of "
        "elements allowed outside it), max_abs, mean_abs, rel_l2 (upper limits), "
        "cosine and agreement (lower limits; agreement judges integer outputs)",
    )

    @field_validator("tolerances")
    @classmethod
    def _known(cls, tolerances: dict[str, float]) -> dict[str, float]:
        known = [*ACCURACY_LIMITS, *sorted(ELEMENTWISE_PARAMS)]
        unknown = sorted(set(tolerances) - set(known))
        if unknown:
            raise ValueError(f"unknown tolerance(s) {unknown}; known: {', '.join(known)}")
        # NaN or infinity would pass or fail every check, and the catalog's JSON cannot store them; a negative
        # limit or parameter can never be met.
        odd = sorted(k for k, v in tolerances.items() if not math.isfinite(v) or v < 0)
        if odd:
            raise ValueError(
                f"tolerance(s) {odd} must be finite numbers >= 0, got {', '.join(f'{k}={tolerances[k]}' for k in odd)}"
            )
        over = sorted(k for k in AT_MOST_ONE if tolerances.get(k, 0) > 1)
        if over:
            raise ValueError(
                f"tolerance(s) {over} must be at most 1: cosine similarity and the fractions of "
                f"elements are within 0..1, got {', '.join(f'{k}={tolerances[k]}' for k in over)}"
            )
        return tolerances

    def limits(self, precision: str) -> dict[str, float]:
        return {**DEFAULT_TOLERANCES.get(precision, {}), **self.tolerances}


class BuildSpec(BaseModel):
    """What to build: precision, shapes and builder knobs. Validated against the model on submit."""

    model_config = ConfigDict(extra="forbid")

    precision: Precision = Precision.FP32
    shapes: dict[str, Dims] = Field(default_factory=dict, description="static shapes per input")
    profiles: list[dict[str, ShapeRange]] = Field(
        default_factory=list,
        description=f"min/opt/max per input, per profile; at most {MAX_PROFILES} different profiles",
    )
    workspace_mib: StrictInt | None = Field(default=None, ge=1, le=1 << 20)
    optimization_level: StrictInt = Field(default=3, ge=0, le=5)
    hardware_compatibility: HardwareCompat = HardwareCompat.NONE
    version_compatible: StrictBool = False
    timing_cache: StrictBool = True
    strongly_typed: StrictBool = False
    # Mixed precision: what stays fp32 when the graph is converted for an fp16/bf16 strongly typed build.
    keep_fp32_ops: list[str] = Field(
        default_factory=list,
        max_length=1000,
        description="op types kept in fp32 in an fp16 or int8 build, e.g. Softmax",
    )
    keep_fp32_layers: list[str] = Field(
        default_factory=list, max_length=10_000, description="node names kept in fp32 in an fp16 or int8 build"
    )
    keep_io_types: StrictBool = Field(default=True, description="fp16 builds keep fp32 inputs and outputs")
    precision_fallback: StrictBool = Field(
        default=True,
        description="a target that cannot build the precision "
        "builds the nearest float one it can (GPU: fp16, then fp32; CPU: fp32) "
        "and says so; false refuses the build instead",
    )
    accuracy_repair: StrictBool = Field(
        default=False,
        description="int8 and fp16: when the artifact fails its accuracy gate, find the layers that break "
        "it (by measured sensitivity) and keep the fewest of them in fp32 that let it pass; "
        "every target's int8 model is quantized (or fp16 graph converted) with that set, and the build's "
        "quantize report records the ranking, what was kept, and the accuracy before and after",
    )
    tf32: StrictBool = Field(
        default=True,
        description="TF32 tensor-core math for fp32 convolutions and matrix products "
        "on GPUs that have it (ONNX Runtime CUDA's use_tf32, on by default as in the runtime); "
        "the accuracy verdict says when differences are what TF32 explains",
    )
    graph_cleanup: GraphCleanup = Field(
        default=GraphCleanup.NONE,
        description="rewrite the graph before building: onnxslim folds constants, infers shapes and removes dead nodes",
    )
    calibration: CalibrationSpec = Field(
        default_factory=lambda: CalibrationSpec(), description="how int8 is calibrated from the samples"
    )
    fixed_inputs: dict[str, Any] = Field(
        default_factory=dict,
        max_length=64,
        description="inputs frozen to a value (a number, or nested lists of the input's static shape): the engine "
        "does not take them, and graph clean-up folds what depends on them, such as an If on a sample rate",
    )
    # How the engines are checked after the build. Not part of the spec hash: they do not change the engine.
    benchmark: BenchmarkSpec = Field(default_factory=BenchmarkSpec)
    accuracy: AccuracySpec = Field(default_factory=AccuracySpec)
    # What the project takes as an engine's evidence. In neither hash: it changes no engine and no check.
    gate: GateSpec = Field(default_factory=GateSpec)

    @field_validator("profiles")
    @classmethod
    def _distinct_profiles(cls, profiles: list[dict[str, ShapeRange]]) -> list[dict[str, ShapeRange]]:
        first: dict[str, int] = {}
        repeats = []
        for i, profile in enumerate(profiles):
            key = json.dumps({n: r.model_dump() for n, r in profile.items()}, sort_keys=True)
            if key in first:
                repeats.append(f"profile {i} repeats profile {first[key]}")
            else:
                first[key] = i
        if repeats:
            shown = ", ".join(repeats[:5]) + (f" and {len(repeats) - 5} more" if len(repeats) > 5 else "")
            raise ValueError(f"profiles repeat: {shown}; give each min/opt/max profile once")
        if len(profiles) > MAX_PROFILES:
            raise ValueError(
                f"at most {MAX_PROFILES} optimization profiles, not {len(profiles)}: each one is tuned "
                "separately, so build time and engine size grow with every profile"
            )
        return profiles

    @model_validator(mode="after")
    def _no_input_twice(self) -> BuildSpec:
        for i, profile in enumerate(self.profiles):
            both = sorted(set(profile) & set(self.shapes))
            if both:
                raise ValueError(f"profile {i}: inputs {both} are also given in 'shapes'; give each input once")
        shaped = set(self.shapes).union(*self.profiles) if self.profiles else set(self.shapes)
        frozen = sorted(set(self.fixed_inputs) & shaped)
        if frozen:
            raise ValueError(f"inputs {frozen} are fixed to a value; give them no shapes")
        for name, value in self.fixed_inputs.items():
            try:
                if len(nested_values(value)[1]) > MAX_FIXED_ELEMENTS:
                    raise ValueError(f"at most {MAX_FIXED_ELEMENTS} values")
            except ValueError as exc:
                raise ValueError(f"fixed_inputs[{name!r}]: {exc}") from None
        return self

    def normalized_profiles(self) -> list[dict[str, ShapeRange]]:
        """Profiles with static ``shapes`` folded in (min = opt = max), the form builders consume."""
        fixed = {n: ShapeRange(min=d, opt=d, max=d) for n, d in self.shapes.items()}
        if not self.profiles:
            return [fixed] if fixed else []
        return [{**p, **fixed} for p in self.profiles]

    def canonical(self) -> dict[str, Any]:
        """The spec with defaults filled and static shapes folded into profiles: what the hash covers. Fields
        added later are left out while they hold their defaults, so earlier specs keep their hash."""
        data = self.model_dump(
            mode="json", exclude={"shapes", "profiles", *CHECK_FIELDS, *LATER_FIELDS, *POLICY_FIELDS}
        )
        for name in LATER_FIELDS:
            value = getattr(self, name)
            if value != type(self).model_fields[name].get_default(call_default_factory=True):
                data[name] = (
                    value.model_dump(mode="json")
                    if isinstance(value, BaseModel)
                    else (value.value if isinstance(value, StrEnum) else value)
                )
        data["profiles"] = [
            {name: rng.model_dump() for name, rng in sorted(p.items())} for p in self.normalized_profiles()
        ]
        return data

    def stored(self) -> dict[str, Any]:
        """What a build row keeps: the canonical spec plus how its engines are checked."""
        return {**self.canonical(), **self.model_dump(mode="json", include={*CHECK_FIELDS, *POLICY_FIELDS})}

    def checks_hash(self) -> str:
        """The hash of the benchmark and accuracy settings: an engine is checked once per distinct value."""
        blob = json.dumps(
            self.model_dump(mode="json", include=set(CHECK_FIELDS)), sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def spec_hash(self) -> str:
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def nested_values(value: Any, depth: int = 0) -> tuple[list[int], list[int | float | bool]]:
    """The shape and the flat values of a number or of rectangular nested lists of numbers (a fixed input's value).
    Raises ValueError for anything else: ragged rows, non-numbers, NaN or infinity, more than 8 dims."""
    if not isinstance(value, list):
        if isinstance(value, bool) or isinstance(value, (int, float)) and math.isfinite(value):
            return [], [value]
        raise ValueError(f"give finite numbers or nested lists of them, not {value!r}")
    if depth >= 8:
        raise ValueError("a value has at most 8 dims")
    parts = [nested_values(item, depth + 1) for item in value]
    inner = parts[0][0] if parts else []
    if any(shape != inner for shape, _ in parts):
        raise ValueError("nested lists must be rectangular: every row of a dim the same length")
    return [len(value), *inner], [x for _, flat in parts for x in flat]


def fixed_input_shape(value: Any) -> list[int]:
    """The shape of a fixed input's value (``[]`` for a number)."""
    return nested_values(value)[0]
