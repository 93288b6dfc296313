"""What the int8 stage did for an int8 engine the farm quantized, as the API answers it: the CPU candidates measured
(ONNX Runtime's family), the accuracy repair (the tensors ranked by measured sensitivity with the ONNX nodes that
keep each in float, the layers kept in fp32, the cosine against fp32 before and after, the failed original kept as a
derived model, and the CPU latency of fp32, int8 without repair and int8 repaired from one run) and the latency
figures measured. Read from the quantize report on the build that made the engine's model (``BuildRow.quantize``,
written by worker/int8/stage.py) and from the engine's own benchmarks against its fp32 sibling.

An fp16 engine whose build asked ``accuracy_repair`` has the same view of its build's fp16 repair stage
(worker/fp16/stage.py): ``precision: fp16``, the nodes ranked by the fp16 gate measured with each kept in fp32 alone,
the nodes kept, the gate before and after; no candidates and no latency (fp16 has no stage that times)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from enginefarm.core.domain import quantize_family
from storage.tables import BenchmarkRow, BuildRow, EngineRow


class GateFigure(BaseModel):
    passed: bool = Field(description="whether the artifact passed its precision's accuracy gate against fp32")
    cosine: float = Field(
        description="the worst output cosine against fp32, on the accuracy check's inputs, as the engine's check judges"
    )
    failures: dict[str, list[str]] = Field(default_factory=dict, description="per output, the limits it broke")
    violations: float | None = Field(
        None, description="fp16: the worst share of output elements outside atol + rtol*|fp32| (the fp16 gate)"
    )
    rel_l2: float | None = Field(None, description="fp16: the worst relative L2 error (null when not finite)")
    non_finite: bool | None = Field(None, description="fp16: an output held inf or NaN")


class RankedTensor(BaseModel):
    tensor: str | None = Field(
        description="int8: the int8 tensor put back in float alone; fp16: the output of the node kept in fp32 alone "
        "(null for a region of several nodes)"
    )
    layers: list[str] = Field(
        description="the ONNX node names that, kept in fp32, keep that tensor in float (fp16: the node or region "
        "kept in fp32 alone)"
    )
    cosine_alone_float: float = Field(description="the output's cosine against fp32 with these layers alone in float")
    cosine_int8: float | None = Field(None, description="int8: the output's cosine against fp32 with every tensor int8")
    cosine_fp16: float | None = Field(None, description="fp16: the output's cosine against fp32, converted as asked")
    violations_alone_float: float | None = Field(
        None, description="fp16: the share of output elements outside the fp16 tolerance with these nodes in fp32"
    )
    violations_fp16: float | None = Field(
        None, description="fp16: the share of output elements outside the fp16 tolerance, converted as asked"
    )
    ops: list[str] | None = Field(None, description="fp16: the op types of the nodes (the first 8)")
    gain: float = Field(
        description="the measured sensitivity the ranking orders by. int8: cosine_alone_float - cosine_int8; fp16: "
        "violations_fp16 - violations_alone_float, the share of output elements brought within the tolerance"
    )
    kept: bool = Field(description="every one of its layers is kept in fp32 by the repair")


class RepairLatency(BaseModel):
    fp32: float = Field(description="fp32's median, ms")
    unrepaired: float | None = Field(None, description="int8 without the repair's kept layers (the failed original)")
    repaired: float | None = Field(None, description="int8 with the kept layers in fp32; null when none were kept")


class RepairSpeedup(BaseModel):
    unrepaired: float | None = Field(None, description="fp32's median over int8 without repair's")
    repaired: float | None = Field(None, description="fp32's median over the repaired int8's")


class UnrepairedVariant(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model_id: int = Field(description="the derived model of int8 without the kept layers (GET /v1/models/{id})")
    version: str
    sha256: str
    recipe: str = Field(description="the CPU int8 recipe it was quantized with")
    accuracy: GateFigure = Field(description="its int8 gate against fp32, failed: why the repair ran")


class Int8Repair(BaseModel):
    precision: Literal["int8", "fp16"] = Field("int8", description="the precision repaired")
    needed: bool = Field(description="false when the artifact passed its gate as built (quantized, or converted)")
    passed: bool = Field(description="whether the artifact passes its gate after the repair")
    recipe: str = Field(
        description="the CPU int8 recipe the repair judged (fp16: worker/rewrite/fp16, the farm's converter)"
    )
    measured_on: str | None = Field(
        None, description="fp16: where the gate was measured, and why a GPU's fp16 error can be larger"
    )
    judged_on: str | None = Field(
        None,
        description="fp16: the target whose artifact was judged: onnxruntime/cuda-smXY on a worker's GPU where the "
        "build has that target and the worker runs it, else the worker's CPU target",
    )
    candidate_layers: int | None = Field(None, description="fp16: the nodes the conversion made fp16, the candidates")
    kept: list[str] = Field(description="the ONNX node names kept in fp32 (empty when not needed or nothing passed)")
    before: GateFigure
    after: GateFigure
    ranking: list[RankedTensor] = Field(description="the most sensitive tensors first (at most 20)")
    ranked_on: str | None = Field(
        None,
        description="int8: the inputs the ranking and the search's screening ran on (before and after are "
        "judged on the accuracy check's)",
    )
    budget: int | None = Field(None, description="the most layers the repair could keep in fp32")
    note: str | None = Field(
        None, description="why the repair stopped without a passing set, and what to do; or which form passed instead"
    )
    form: str | None = Field(
        None,
        description="int8: where no set of layers within the budget passes with the repair's recipe, the CPU form "
        "that passes as it is (convolutions, dense-convolutions or dynamic: whole kinds of layer kept in float)",
    )
    forms: dict[str, GateFigure] | None = Field(
        None, description="int8: each other CPU form judged after the layer search found nothing, in order"
    )
    evaluations: int | None = None
    seconds: float | None = None
    check_seconds: float | None = Field(
        None, description="seconds of one accuracy check of the model (the first: quantize or convert, build, judge)"
    )
    cost_in_checks: float | None = Field(None, description="the repair's seconds in such checks")
    unrepaired: UnrepairedVariant | None = Field(
        None, description="the failed original, kept as a variant of the build when the repair kept layers"
    )
    latency_ms: RepairLatency | None = Field(
        None, description="CPU medians of fp32, int8 without repair and int8 repaired, from one interleaved run"
    )
    speedup: RepairSpeedup | None = None
    latency_where: str | None = Field(None, description="what was timed, where")
    latency_note: str | None = Field(None, description="why a latency is missing")
    faster_than_fp32: bool | None = Field(None, description="whether the repaired int8 is faster than fp32 (CPU)")
    recommend: str | None = Field(None, description="the precision to build instead, when repaired int8 is slower")
    speed_note: str | None = Field(None, description="the figures, when the repaired int8 is not faster than fp32")


class Int8Candidate(BaseModel):
    name: str
    kept: bool = Field(description="the candidate this engine's model was made with")
    passed: bool | None = Field(None, description="whether it passed the int8 gate (null: it did not quantize)")
    cosine: float | None = None
    judged_on: str | None = Field(None, description="the inputs its gate was judged on: the accuracy check's")
    speedup: float | None = Field(None, description="fp32's median over the candidate's on the quantizing worker")
    int8_median_ms: float | None = None
    why: str | None = Field(None, description="on the kept one: why it was kept")
    error: str | None = None


class Int8Timing(BaseModel):
    measured_by: Literal["quantize", "benchmark"] = Field(
        description="quantize: the int8 stage's timing of the kept CPU candidate on the worker that quantized; "
        "benchmark: the engine's benchmark against its fp32 sibling, interleaved"
    )
    where: str = Field(description="the shapes and the device")
    fp32_median_ms: float | None = None
    int8_median_ms: float | None = Field(
        None, description="the int8 model as built, with the repair's kept layers where it kept any"
    )
    speedup: float | None = None


class PrecisionStage(BaseModel):
    """The stage that made an engine's reduced precision, of the kind its ``precision`` says. ``int8``: the int8
    stage (the CPU candidates, the accuracy repair, the latency of the model as built; with a repair that kept
    layers, int8 without them is timed once, beside fp32 and the repaired int8, in the repair's ``latency_ms``).
    ``fp16``: its build's fp16 repair stage (``repair`` only, no candidates, no latency)."""

    engine_id: int
    precision: Literal["int8", "fp16"] = Field("int8", description="the engine's precision, and the stage's")
    target: str
    build_id: int = Field(description="the build whose int8 stage made the engine's model")
    family: Literal["onnxruntime", "tensorrt"] = Field(description="the quantization recipe's family")
    candidates: list[Int8Candidate] = Field(description="ONNX Runtime's CPU candidates measured (onnxruntime family)")
    repair: Int8Repair | None = Field(None, description="the accuracy repair, when the spec asked accuracy_repair")
    latency: list[Int8Timing] = Field(description="fp32 and int8 medians where measured")


def engine_int8(engine: EngineRow, build: BuildRow | None, benchmarks: list[BenchmarkRow]) -> PrecisionStage | None:
    """The int8 stage of ``engine`` from ``build``'s quantize report; None when it is not int8 or the build's stage
    left no report for its family."""
    family = quantize_family(engine.backend)
    if build is None or engine.precision not in ("int8", "fp16"):
        return None
    report = ((build.quantize or {}).get("reports") or {}).get(family)
    if not report:
        return None
    # An fp16 engine has a view only of an fp16 repair (not of the int8 stage of a build whose target fell back).
    if (report.get("repair") or {}).get("precision", "int8") != engine.precision:
        return None
    latency = []
    vs = report.get("vs_fp32") or {}
    if vs.get("fp32_median_ms") is not None:
        latency.append(
            Int8Timing(
                measured_by="quantize",
                where=f"the spec's opt shapes on the quantizing worker's CPU ({_kept_name(report)})",
                fp32_median_ms=vs["fp32_median_ms"],
                int8_median_ms=vs.get("int8_median_ms"),
                speedup=vs.get("speedup"),
            )
        )
    for b in benchmarks:
        vs = (b.stats or {}).get("vs_fp32") or {}
        if vs.get("fp32_median_ms") is not None:
            latency.append(
                Int8Timing(
                    measured_by="benchmark",
                    where=f"{b.shape_key} on {(b.stats or {}).get('device') or b.gpu_name or b.cpu_name or '?'}",
                    fp32_median_ms=vs["fp32_median_ms"],
                    int8_median_ms=vs.get("int8_median_ms"),
                    speedup=vs.get("speedup"),
                )
            )
    return PrecisionStage(
        engine_id=engine.id,
        precision=engine.precision,
        target=engine.target,
        build_id=build.id,
        family=family,
        candidates=[_candidate(c) for c in report.get("candidates") or []],
        repair=_repair(report["repair"]) if report.get("repair") else None,
        latency=latency,
    )


def _kept_name(report: dict[str, Any]) -> str:
    kept = next((c["name"] for c in report.get("candidates") or [] if c.get("kept")), None)
    return f"candidate {kept}" if kept else "the int8 model"


def _candidate(c: dict[str, Any]) -> Int8Candidate:
    return Int8Candidate(
        name=c["name"],
        kept=bool(c.get("kept")),
        passed=c.get("pass"),
        cosine=c.get("cosine"),
        judged_on=c.get("judged_on"),
        speedup=c.get("speedup"),
        int8_median_ms=c.get("int8_median_ms"),
        why=c.get("why"),
        error=c.get("error"),
    )


def _figure(f: dict[str, Any]) -> GateFigure:
    return GateFigure(
        passed=bool(f.get("pass")),
        cosine=f.get("cosine", 0.0),
        failures=f.get("failures") or {},
        violations=f.get("violations"),
        rel_l2=f.get("rel_l2"),
        non_finite=f.get("non_finite"),
    )


def _ranked(t: dict[str, Any], kept: set[str]) -> RankedTensor:
    fp16 = "violations_fp16" in t
    return RankedTensor(
        tensor=t.get("tensor"),
        layers=t["layers"],
        cosine_alone_float=t["cosine_alone_float"],
        cosine_int8=t.get("cosine_int8"),
        cosine_fp16=t.get("cosine_fp16"),
        violations_alone_float=t.get("violations_alone_float"),
        violations_fp16=t.get("violations_fp16"),
        ops=t.get("ops"),
        gain=round(
            t["violations_fp16"] - t["violations_alone_float"] if fp16 else t["cosine_alone_float"] - t["cosine_int8"],
            6,
        ),
        kept=bool(t["layers"]) and set(t["layers"]) <= kept,
    )


def _repair(r: dict[str, Any]) -> Int8Repair:
    kept = set(r.get("kept") or [])
    return Int8Repair(
        precision=r.get("precision", "int8"),
        needed=bool(r.get("needed")),
        passed=bool(r.get("passed")),
        recipe=r.get("recipe", "operator"),
        measured_on=r.get("measured_on"),
        judged_on=r.get("judged_on"),
        candidate_layers=r.get("candidates"),
        kept=list(r.get("kept") or []),
        before=_figure(r["before"]),
        after=_figure(r.get("after") or r["before"]),
        ranking=[_ranked(t, kept) for t in r.get("ranking") or []],
        ranked_on=r.get("ranked_on"),
        budget=r.get("budget"),
        note=r.get("note"),
        form=r.get("form"),
        forms={name: _figure(f) for name, f in r["forms"].items()} if r.get("forms") else None,
        evaluations=r.get("evaluations"),
        seconds=r.get("seconds"),
        check_seconds=r.get("check_seconds"),
        cost_in_checks=r.get("cost_in_checks"),
        unrepaired=_unrepaired(r["unrepaired"]) if r.get("unrepaired") else None,
        latency_ms=RepairLatency(**r["latency_ms"]) if r.get("latency_ms") else None,
        speedup=RepairSpeedup(**r["speedup"]) if r.get("speedup") else None,
        latency_where=r.get("latency_where"),
        latency_note=r.get("latency_note"),
        faster_than_fp32=r.get("faster_than_fp32"),
        recommend=r.get("recommend"),
        speed_note=r.get("speed_note"),
    )


def _unrepaired(u: dict[str, Any]) -> UnrepairedVariant:
    return UnrepairedVariant(
        model_id=u["model_id"],
        version=u["version"],
        sha256=u["sha256"],
        recipe=u.get("recipe", "operator"),
        accuracy=_figure(u["accuracy"]),
    )
