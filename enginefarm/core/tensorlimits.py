"""How large the input tensors a spec makes the farm allocate may be (``TensorLimits``, from the settings), and every
input tensor and set of inputs of a spec over those limits, as problems of ``validation.validate_spec``'s 422: checked
when the spec is accepted, so a worker never tries to allocate more."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from enginefarm.core.domain import ModelInfo
from enginefarm.core.errors import problem
from enginefarm.core.shapes import dtype_bytes, format_bytes, format_dims
from enginefarm.core.spec import MAX_DIM, BuildSpec

if TYPE_CHECKING:
    from enginefarm.core.config import Settings


@dataclass(frozen=True)
class TensorLimits:
    """How large an input tensor the farm allocates for a build may be: alone (elements and bytes), and all the inputs
    of one set of shapes together. Checked when the spec is accepted, so a worker never tries to allocate more."""

    max_elements: int = 1 << 30
    max_bytes: int = 1 << 30
    max_total_bytes: int = 4 << 30

    @classmethod
    def of(cls, settings: Settings | None = None) -> TensorLimits:
        """The limits the farm's settings give (ENGINEFARM_MAX_TENSOR_ELEMENTS, ...)."""
        from enginefarm.core.config import get_settings

        settings = settings or get_settings()
        return cls(
            max_elements=settings.max_tensor_elements,
            max_bytes=settings.max_tensor_bytes,
            max_total_bytes=settings.max_inputs_bytes,
        )


def _allocated_shapes(spec: BuildSpec, info: ModelInfo) -> Iterator[tuple[list[str | int], str, dict[str, list[int]]]]:
    """``(loc, what, input → dims)`` for every set of input shapes the farm allocates tensors at for this spec: each
    profile's max, opt and min (the builder times its tactics there; the benchmark and the accuracy check run at the
    opt shapes), and each benchmark shape set or batch size. Inputs the model fixes keep their dims throughout."""
    static = {t.name: [int(d) for d in t.dims if d is not None] for t in info.inputs if not t.dynamic_axes}
    profiles = spec.normalized_profiles()
    for i, profile in enumerate(profiles):
        for kind in ("max", "opt", "min"):
            yield (
                ["spec", "profiles", i],
                f"profile {i}'s {kind} shapes",
                {**static, **{name: list(getattr(rng, kind)) for name, rng in profile.items()}},
            )
    if not profiles:
        yield ["spec", "shapes"], "the model's fixed shapes", static
    opt = {**static, **({name: list(rng.opt) for name, rng in profiles[0].items()} if profiles else {})}
    for i, given in enumerate(spec.benchmark.shapes):
        yield ["spec", "benchmark", "shapes", i], f"benchmark shape set {i}", {**opt, **given}
    batched = {t.name for t in info.inputs if 0 in t.dynamic_axes}
    for b in spec.benchmark.batch_sizes:
        yield (
            ["spec", "benchmark", "batch_sizes"],
            f"benchmark batch size {b}",
            {name: [b, *dims[1:]] if name in batched and dims else dims for name, dims in opt.items()},
        )


def tensor_size_problems(spec: BuildSpec, info: ModelInfo, limits: TensorLimits) -> list[dict[str, Any]]:
    """Every input tensor, and every set of inputs, that would be larger than ``limits`` (each tensor reported once)."""
    by_name = {t.name: t for t in info.inputs}
    problems: list[dict[str, Any]] = []
    seen: set[tuple[str, tuple[int, ...]]] = set()
    seen_sets: set[tuple[Any, ...]] = set()
    for loc, what, shapes in _allocated_shapes(spec, info):
        sizes: dict[str, int] = {}
        too_big = False
        for name, dims in shapes.items():
            tensor = by_name.get(name)
            # Unknown inputs, wrong ranks and dims out of range are problems of their own (validate_spec's).
            if tensor is None or len(dims) != len(tensor.dims) or any(not 1 <= d <= MAX_DIM for d in dims):
                continue
            elements = math.prod(dims)
            sizes[name] = size = elements * dtype_bytes(tensor.dtype)
            if size <= limits.max_bytes and elements <= limits.max_elements:
                continue
            too_big = True
            if (name, tuple(dims)) in seen:
                continue
            seen.add((name, tuple(dims)))
            limit = (
                f"{format_bytes(limits.max_bytes)} a tensor (ENGINEFARM_MAX_TENSOR_BYTES)"
                if size > limits.max_bytes
                else f"{limits.max_elements} elements a tensor (ENGINEFARM_MAX_TENSOR_ELEMENTS)"
            )
            problems.append(
                problem(
                    loc + [name],
                    f"input {name!r} at {format_dims(dims)} ({what}) is {elements} {tensor.dtype} elements, "
                    f"{format_bytes(size)}: over the limit of {limit}; give it smaller shapes",
                )
            )
        total = sum(sizes.values())
        key = tuple(sorted((name, tuple(shapes[name])) for name in sizes))
        if not too_big and total > limits.max_total_bytes and key not in seen_sets:
            seen_sets.add(key)
            each = ", ".join(f"{name!r} {format_bytes(size)}" for name, size in sizes.items())
            problems.append(
                problem(
                    loc,
                    f"the inputs at {what} take {format_bytes(total)} together ({each}): over the limit of "
                    f"{format_bytes(limits.max_total_bytes)} for all inputs (ENGINEFARM_MAX_INPUTS_BYTES); "
                    "give them smaller shapes",
                )
            )
    return problems
