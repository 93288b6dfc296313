"""Which plan file each compute capability gets in a Triton repository, which one (if any) is the default, and what
the export must warn about: the choices ``enginefarm.client.triton`` writes into ``config.pbtxt``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from enginefarm.client.safepaths import check_name, record_id
from enginefarm.core.domain import arch_of_cc, cc_tuple

RTX_WARNING = (
    "TensorRT-RTX engines: Triton's stock TensorRT backend (platform tensorrt_plan) links full TensorRT "
    "and will not deserialize TensorRT-RTX plans; serve this repository with a Triton whose TensorRT "
    "backend is built against TensorRT-RTX."
)


def portable(engine: Mapping[str, Any]) -> bool:
    """A TensorRT-RTX engine built without a target: it runs on every compute capability it lists."""
    return (
        engine.get("backend") == "tensorrt-rtx"
        and not engine.get("compute_capability")
        and len(engine.get("compute_capabilities") or []) > 1
    )


def ampere_plus(engine: Mapping[str, Any]) -> bool:
    """A TensorRT engine built hardware-compatible for Ampere and later: it runs on any discrete GPU from sm80 on."""
    return engine.get("backend") == "tensorrt" and engine.get("hardware_compat") == "ampere_plus"


def covers(engine: Mapping[str, Any]) -> str:
    """The compute capabilities a plan runs on, in words."""
    if ampere_plus(engine):
        return "8.0 and newer (Ampere+ hardware-compatible, discrete GPUs)"
    return ", ".join(
        sorted(engine.get("compute_capabilities") or [engine.get("compute_capability") or "?"], key=cc_tuple)
    )


def _plan_name(cc: str, engine: Mapping[str, Any], taken: set[str]) -> str:
    if portable(engine):
        name = "model_portable.plan"
    elif ampere_plus(engine) and engine.get("compute_capability"):
        name = f"model_{arch_of_cc(engine['compute_capability'])}_ampere_plus.plan"
    else:
        name = f"model_{arch_of_cc(cc)}.plan"
    if name in taken:  # a second engine of the same kind: its id tells them apart
        name = name.replace(".plan", f"_{record_id(engine.get('id'), 'the engine for ' + cc)}.plan")
    return check_name(name)


def plan_layout(engines: Mapping[str, tuple[Mapping[str, Any], Any]]) -> tuple[dict[str, str], str | None, list[str]]:
    """``(cc_model_filenames, default_model_filename, warnings)`` for the plans chosen per compute capability.

    Triton hands ``default_model_filename`` to every GPU missing from ``cc_model_filenames``: an A100 (8.0) or a T4
    (7.5) would get a plan built for another GPU, which cannot load there. So the default is only a plan that runs
    beyond the compute capability it was built on: an Ampere+ hardware-compatible TensorRT engine, else the portable
    TensorRT-RTX engine that covers the most, and the warning says which compute capabilities it covers. Without
    one there is no default, and the warning lists the compute capabilities the model loads on."""
    by_engine: dict[Any, str] = {}
    files: dict[str, str] = {}
    for cc in sorted(engines, key=cc_tuple):
        engine = engines[cc][0]
        key = engine.get("id", engine.get("sha256")), engine.get("sha256")
        if key not in by_engine:
            by_engine[key] = _plan_name(cc, engine, set(by_engine.values()))
        files[cc] = by_engine[key]
    wide = [e for e, _ in engines.values() if ampere_plus(e) or portable(e)]
    if wide:
        best = max(wide, key=lambda e: (ampere_plus(e), len(e.get("compute_capabilities") or [])))
        default = next(files[cc] for cc, (e, _) in engines.items() if e is best)
        kind = "Ampere+ TensorRT" if ampere_plus(best) else "portable TensorRT-RTX"
        return (
            files,
            default,
            [
                f"default_model_filename is {default}, the {kind} plan, for GPUs missing from cc_model_filenames; "
                f"it runs on compute capability {covers(best)}, and a GPU outside those cannot load this model"
            ],
        )
    listed = ", ".join(sorted(files, key=cc_tuple))
    return (
        files,
        None,
        [
            f"no default_model_filename: every plan runs only on the compute capability it was built for, so Triton "
            f"loads this model on GPUs of compute capability {listed} and on no other (an A100 is 8.0, a T4 7.5); "
            "a portable TensorRT-RTX engine (target tensorrt-rtx/portable) or an Ampere+ hardware-compatible TensorRT "
            "engine would serve as the default"
        ],
    )


def engine_warnings(
    engines: Mapping[str, tuple[Mapping[str, Any], Path]], limits: list[int], max_batch: int
) -> list[str]:
    if not engines:
        return []
    warnings = []
    backends = {e["backend"] for e, _ in engines.values()}
    if "tensorrt-rtx" in backends:
        warnings.append(RTX_WARNING)
    if len(backends) > 1:
        warnings.append("engines mix TensorRT and TensorRT-RTX plans; one Triton TensorRT backend loads only one kind")
    precisions = {cc: e.get("precision") for cc, (e, _) in engines.items()}
    if len(set(precisions.values())) > 1:
        listed = ", ".join(f"{p} on {cc}" for cc, p in sorted(precisions.items(), key=lambda kv: cc_tuple(kv[0])))
        warnings.append(f"engines mix precisions ({listed}): results and speed depend on the GPU that serves them")
    if len(limits) > 1 and limits[0] < max_batch:
        warnings.append(
            f"the engines have {len(limits)} optimization profiles; Triton's TensorRT backend uses profile 0 unless "
            f"instance_group lists profiles, and profile 0 batches only up to {limits[0]} while max_batch_size is "
            f"{max_batch}: Triton's config auto-complete rejects that"
        )
    return warnings
