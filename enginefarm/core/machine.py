"""A deploy machine's fingerprint: the one type the probe fills, the client sends, the API validates and documents
(GET and POST /v1/resolve) and the compatibility rules judge.

Every field is optional; what is missing is reported as unchecked. The constraints hold wherever a fingerprint is
made: a bad ``--cc`` on the command line is refused by the same rule as a bad ``compute_capability`` in a request,
and free text (the GPU's name, the OS), which resolution looks up in the catalog, is text the catalog can store
(``enginefarm.core.text.Name``, a ``CatalogText``) in the query string, the JSON body and the dashboard's form alike.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, ValidationError, field_validator
from pydantic.dataclasses import dataclass

from enginefarm.core.domain import JETSON_CCS
from enginefarm.core.shapes import check_shape_request
from enginefarm.core.spec import Precision
from enginefarm.core.text import Name

CC_PATTERN = r"^\d{1,2}\.\d$"
VERSION_PATTERN = r"^\d+(\.\d+){0,3}$"
PLATFORM_PATTERN = r"^(x86_64|aarch64)$"
JETPACK_PATTERN = r"^\d+(\.\d+){0,2}$"
# The short names a fingerprint's fields go by in a query string (GET /v1/resolve, the dashboard's resolver page)
# and as the CLI's flags (--cc, --trt-rtx); a field not named here keeps its own name.
SHORT_NAMES = {
    "gpu_name": "gpu",
    "compute_capability": "cc",
    "driver_version": "driver",
    "cuda_version": "cuda",
    "trt_version": "trt",
    "trt_rtx_version": "trt_rtx",
    "lean_runtime": "lean",
    "ort_version": "ort",
    "cpu_name": "cpu",
}


@dataclass(config=ConfigDict(extra="forbid"))
class Machine:
    """A deploy machine's fingerprint. Every field is optional; what is missing is reported as unchecked."""

    gpu_name: Name | None = Field(default=None, description="GPU model name as NVML reports it")
    compute_capability: str | None = Field(default=None, pattern=CC_PATTERN, description="e.g. 8.6")
    memory_mib: int | None = Field(default=None, strict=True, ge=1, le=1 << 24)
    driver_version: str | None = Field(default=None, pattern=VERSION_PATTERN)
    cuda_version: str | None = Field(default=None, pattern=VERSION_PATTERN)
    trt_version: str | None = Field(default=None, pattern=VERSION_PATTERN, description="TensorRT runtime version")
    trt_rtx_version: str | None = Field(
        default=None, pattern=VERSION_PATTERN, description="TensorRT-RTX runtime version"
    )
    lean_runtime: bool = Field(
        default=False,
        strict=True,
        description="trt_version is the lean runtime's: it loads only version-compatible engines",
    )
    ort_version: str | None = Field(default=None, pattern=VERSION_PATTERN, description="ONNX Runtime version")
    ort_cuda: bool = Field(
        default=False,
        strict=True,
        description="ONNX Runtime runs here with its CUDA execution provider on the "
        "GPU: onnxruntime/cuda-smXY artifacts are served only then",
    )
    platform: str | None = Field(default=None, pattern=PLATFORM_PATTERN)
    os: Name | None = None
    cpu_name: Name | None = Field(
        default=None,
        description="the CPU model (/proc/cpuinfo's model name): CPU artifacts are ranked by latency measured on it",
    )
    jetpack: str | None = Field(default=None, pattern=JETPACK_PATTERN)
    # What the machine will run: per input, the min/opt/max shapes it sends (a fixed shape has min = opt = max).
    # Empty: shapes are not judged.
    shapes: dict[str, Any] = Field(
        default_factory=dict,
        max_length=1000,
        description="what the machine will run: per input, dims ([1, 3, 640, 640]) or {min, opt, max} dims; "
        "an engine whose profiles do not cover them is excluded",
    )
    precisions: list[Precision] = Field(
        default_factory=list, max_length=5, description="the precisions the machine accepts (default: any)"
    )

    @field_validator("shapes")
    @classmethod
    def _shapes(cls, shapes: dict[str, Any]) -> dict[str, Any]:
        return check_shape_request(shapes)

    @property
    def gpu_runtimes(self) -> list[str]:
        """The GPU runtimes a machine with a GPU names: it is handed engines of these, never a CPU artifact unasked.
        A runtime installed on a machine without a GPU (a CPU box with tensorrt_rtx for building) names none."""
        if not (self.compute_capability or self.gpu_name):
            return []
        named = [
            name
            for name, version in (("TensorRT", self.trt_version), ("TensorRT-RTX", self.trt_rtx_version))
            if version
        ]
        return named + (["ONNX Runtime CUDA"] if self.ort_cuda else [])

    @property
    def is_jetson(self) -> bool:
        return bool(self.jetpack) or self.compute_capability in JETSON_CCS

    @classmethod
    def detected(cls, **fields: Any) -> Machine:
        """A fingerprint from what a probe read: a value the rules cannot use (a platform other than x86_64 or
        aarch64, a version string of another form) is left out, as unknown, instead of failing the probe."""
        while True:
            try:
                return cls(**fields)
            except ValidationError as exc:
                bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]} & set(fields)
                if not bad:
                    raise
                fields = {k: v for k, v in fields.items() if k not in bad}
