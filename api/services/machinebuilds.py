"""Builds for a deploy machine: which target a machine that nothing fits needs, what would fit its shapes, and the
build resolve submits for it (``build=true``), reusing the spec the model was built with before."""

from __future__ import annotations

from typing import Any

from api.services.builds import submit_build, wait_reason
from enginefarm.core.config import Settings
from enginefarm.core.domain import ARCHES, ORT_CUDA_PREFIX, Backend, Target, arch_of_cc
from enginefarm.core.errors import SpecInvalid, TargetUnavailable
from enginefarm.core.machine import Machine
from enginefarm.core.profilefit import profile_covers
from enginefarm.core.spec import BuildSpec
from storage import catalog, liveness
from storage.db import session_scope


def targets_for_machine(machine: Machine) -> list[Target]:
    """The targets whose engines would run on this machine, best first.

    A GPU machine gets GPU targets only: TensorRT-RTX where it runs TensorRT-RTX (or says nothing
    about its runtimes) on x86_64, full TensorRT where it runs TensorRT. A machine without a known
    GPU gets the ONNX Runtime CPU artifact for its platform.
    """
    platform = machine.platform or "x86_64"
    cc = machine.compute_capability
    if not cc:
        return [Target(Backend.ONNXRUNTIME, f"cpu-{platform}")]
    arch = arch_of_cc(cc)
    said_nothing = not (machine.trt_version or machine.trt_rtx_version or machine.ort_cuda)
    out = []
    if (
        (machine.trt_rtx_version or said_nothing)
        and platform == "x86_64"
        and not machine.is_jetson
        and arch in ARCHES[Backend.TENSORRT_RTX]
    ):
        out.append(Target(Backend.TENSORRT_RTX, arch))
    if (machine.trt_version or said_nothing) and arch in ARCHES[Backend.TENSORRT]:
        out.append(Target(Backend.TENSORRT, arch))
    if machine.ort_cuda and f"{ORT_CUDA_PREFIX}{arch}" in ARCHES[Backend.ONNXRUNTIME]:
        out.append(Target(Backend.ONNXRUNTIME, f"{ORT_CUDA_PREFIX}{arch}"))
    return out


def _dims(dims: list[int]) -> str:
    return "x".join(str(d) for d in dims)


def what_would_fit(req: Any) -> dict[str, Any]:
    """For a 404 from /v1/resolve: the targets, precision and profile an engine for this machine would need, and
    the command (or query parameter) that builds it. ``req`` is a ResolveRequest."""
    m = req.machine
    targets = [str(t) for t in targets_for_machine(m)]
    flags = [f"--version {req.version}"] if req.version else []
    flags += [
        f"--{name} '{value}'" if " " in str(value) else f"--{name} {value}"
        for name, value in (
            ("cc", m.compute_capability),
            ("gpu", m.gpu_name),
            ("trt", m.trt_version),
            ("trt-rtx", m.trt_rtx_version),
            ("platform", m.platform),
            ("jetpack", m.jetpack),
            ("precision", req.precision),
        )
        if value
    ]
    shapes = m.shapes or {}
    if shapes and all(r["min"] == r["max"] for r in shapes.values()):
        flags.append("--shapes " + ",".join(f"{n}:{_dims(r['opt'])}" for n, r in shapes.items()))
    elif shapes:
        for flag, key in (("--minShapes", "min"), ("--optShapes", "opt"), ("--maxShapes", "max")):
            flags.append(f"{flag} " + ",".join(f"{n}:{_dims(r[key])}" for n, r in shapes.items()))
    return {
        "targets": targets,
        "precision": req.precision,
        "shapes": shapes or None,
        "command": " ".join(["enginefarm fetch", req.model, *flags, "--build"]) if targets else None,
        "query": "build=true" if targets else None,
    }


def _runtime_of(machine: Machine, target: Target) -> str | None:
    return {Backend.TENSORRT_RTX: machine.trt_rtx_version, Backend.TENSORRT: machine.trt_version}.get(target.backend)


def pick_target(machine: Machine, served: dict[str, set[str]]) -> tuple[Target, str | None]:
    """The target to build for this machine and, when no live worker can build it yet, why.

    Raises TargetUnavailable when nothing would run here, or when live workers build the target only
    with runtime versions this machine cannot load (an engine built now would be rejected again).
    """
    targets = targets_for_machine(machine)
    if not targets:
        raise TargetUnavailable(
            f"the farm builds no target for compute capability {machine.compute_capability} on "
            f"{machine.platform or 'x86_64'} with the runtimes you named"
        )
    for t in targets:
        versions, runtime = served.get(str(t)), _runtime_of(machine, t)
        if versions is not None and (runtime is None or runtime in versions):
            return t, None
    mismatched = [(t, served[str(t)]) for t in targets if str(t) in served]
    if mismatched:
        t, versions = mismatched[0]
        raise TargetUnavailable(
            f"live workers build {t} with {t.backend.value} {', '.join(sorted(versions)) or 'an unknown version'}; "
            f"you run {_runtime_of(machine, t)}, so an engine built now would not load here. Install that "
            f"runtime, or start a worker with yours",
            target=str(t),
        )
    t = targets[0]
    return t, f"no live worker serves {t}; the build waits in the queue until one starts"


def covering_spec(spec: dict[str, Any], shapes: dict[str, dict[str, list[int]]]) -> dict[str, Any]:
    """``spec`` with a profile that covers ``shapes`` (what the asking machine runs): unchanged when one of its
    profiles does; otherwise one more profile, the first one with the asked inputs set to the asked ranges, so
    the new engine also serves what the spec was built for."""
    profiles = [{n: r.model_dump() for n, r in p.items()} for p in BuildSpec(**spec).normalized_profiles()]
    if any(profile_covers(p, shapes) for p in profiles):
        return spec
    added = {**(profiles[0] if profiles else {}), **{n: dict(r) for n, r in shapes.items()}}
    return {**{k: v for k, v in spec.items() if k != "shapes"}, "profiles": [*profiles, added]}


def build_for_machine(
    settings: Settings,
    model: str,
    version: str | None,
    machine: Machine,
    *,
    spec_hash: str | None,
    precision: str | None,
    project: str | None = None,
    token_id: int | None = None,
) -> dict[str, Any]:
    """Submit (or find already running) the build that would give this machine an engine; the 202 body.

    The target is the machine's own, so there is no other to choose: where no live worker serves it the build
    is queued to wait for one, and the answer says so. The queue limits apply as to any build. A machine that
    names the shapes it runs gets a spec whose profiles cover them (``covering_spec``)."""
    with session_scope(settings) as s:
        rows = catalog.find_models(s, model, project=project)  # every version, newest first
        row = catalog.find_models(s, model, version, project)[0] if version and version != "latest" else rows[0]
        served = liveness.served_targets(s, settings.worker_ttl_seconds)
        target, note = pick_target(machine, served)
        every = [r.id for r in rows]
        if spec_hash:
            source = catalog.latest_build(s, every, spec_hash=spec_hash)
            if source is None:
                raise SpecInvalid(
                    f"no build of {model} used spec {spec_hash}; see `enginefarm ls builds`",
                    problems=[{"loc": ["spec_hash"], "msg": "no build of this model used this spec"}],
                )
        else:
            source = catalog.latest_build(s, [row.id], precision=precision) or catalog.latest_build(
                s, every, precision=precision
            )
        asked = dict(source.spec) if source else {"precision": precision or "fp32"}
        if machine.shapes:
            asked = covering_spec(asked, machine.shapes)
        spec = BuildSpec.model_validate(asked)
        hashed = spec.spec_hash()
        open_task = catalog.find_open_task(s, row.id, hashed, str(target))
        model_id = row.id
        if open_task is not None:
            build_id, already = open_task.build_id, True
    if open_task is None:
        build_id, already = (
            submit_build(settings, model_id, [str(target)], spec, token_id=token_id, queue_without_worker=True),
            False,
        )
    with session_scope(settings) as s:
        state = next(t.state for t in catalog.get_build(s, build_id).tasks if t.target == str(target))
    detail = wait_reason(str(target), state, served)
    verb = "is already building" if already else "submitted"
    return {
        "detail": f"no engine of {model} runs on this machine; build {build_id} {verb} {target}"
        + (f" ({note})" if note else ""),
        "build_id": build_id,
        "target": str(target),
        "spec_hash": hashed,
        # What it builds, and from where: the spec of the model's latest build (of the precision or spec hash
        # asked), so a caller can see it did not build something else than it meant.
        "spec_from": f"build {source.id}'s spec" if source else "the default spec",
        "precision": spec.precision.value,
        "state": state,
        "status_detail": detail or note,
        "already_building": already,
    }
