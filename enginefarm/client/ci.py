"""``enginefarm ci``: the command a CI job runs. Upload (idempotent by sha256), build a target matrix, wait with a
deadline for the builds and their checks, ask the farm's gate (``GET /v1/models/{id}/gate``), write JUnit XML and
a Markdown summary, and exit 0 only when the gate passes.

Its progress is one plain line per change, with a UTC timestamp: CI logs have no terminal, so there are no bars,
spinners or colours to redraw."""

from __future__ import annotations

import difflib
import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import httpx
import typer

from enginefarm.client import ApiError, Client
from enginefarm.client.cirepair import REPAIR, recount, with_repair
from enginefarm.client.cisummary import junit_xml, markdown_summary
from enginefarm.client.safepaths import UnsafePath, write_text
from enginefarm.client.sdk import BUILD_WAIT_S
from enginefarm.client.terminal import PRECISION_HELP
from enginefarm.core.domain import FINAL_STATES
from enginefarm.core.trtexec import TRTEXEC_FLAGS, spec_from_trtexec

CHECKS = ("build", "benchmark", "accuracy", "latency_regression")
# Answers worth asking again before the deadline: the farm restarting or briefly overloaded.
TRANSIENT_STATUS = {429, 502, 503, 504}

Log = Callable[[str], None]


def log_line(message: str) -> None:
    """One progress line on stdout with a UTC timestamp, flushed at once so the CI log shows it as it happens."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"{stamp} {message}", flush=True)


@dataclass
class CiOptions:
    model_file: Path
    name: str
    targets: list[str]
    spec: dict[str, Any] = field(default_factory=dict)
    version: str | None = None
    project: str | None = None
    timeout: float = 1800.0
    max_regression_pct: float = 10.0
    pending: str = "pass"
    junit: Path | None = None
    summary: Path | None = None
    poll: float = 2.0
    samples: Path | None = None
    repair: bool = False


@dataclass
class CiResult:
    """What the run ends with: the gate's answer (or one made up for a run refused before the gate) and the
    exit code."""

    gate: dict[str, Any]
    exit_code: int
    model: dict[str, Any] | None = None
    build_id: int | None = None


# The build and ci commands take trtexec's build flags as trtexec spells them, after their own options.
TRTEXEC_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}
TRTEXEC_HELP = (
    "\n\nAlso takes trtexec's build flags as trtexec spells them: --fp16, --bf16, --int8, --fp8, --best, "
    "--stronglyTyped, --shapes=, --minShapes=, --optShapes=, --maxShapes=, --memPoolSize=workspace:SIZE, "
    "--builderOptimizationLevel=N, --hardwareCompatibilityLevel=ampere+, --versionCompatible, "
    "--timingCacheFile=PATH; or all of them in one --trtexec-args \"...\" (as TensorRT Cloud takes them)."
)
TRTEXEC_ARGS_OPT = typer.Option(
    None, "--trtexec-args", help="trtexec build flags in one string, e.g. \"--fp16 --memPoolSize=workspace:4096M\""
)


def build_spec(spec_file: Path | None, precision: str | None, trtexec: list[str]) -> dict[str, Any]:
    """The build spec as ``enginefarm build`` and ``ci`` make it: the spec file, then the trtexec flags, then
    --precision, each over the fields before it. Raises ValueError saying what is wrong."""
    spec = json.loads(spec_file.read_text()) if spec_file else {}
    if not isinstance(spec, dict):
        raise ValueError(f"{spec_file}: a build spec is a JSON object")
    flags = spec_from_trtexec(trtexec)
    if precision and "precision" in flags and flags["precision"] != precision:
        # trtexec's --fp16 beside --precision fp32: one of them would be dropped without a word.
        raise ValueError(
            f"--precision {precision} and the trtexec flags ({flags['precision']}) ask for two precisions; give one"
        )
    spec.update(flags)
    if precision:
        spec["precision"] = precision
    return spec


class UnknownOption(typer.BadParameter):
    """A usage error (exit 2) worded as click words an unknown option, not as an invalid value."""

    def format_message(self) -> str:
        return self.message


def trtexec_flags(ctx: typer.Context, trtexec_args: str | None) -> list[str]:
    """The command's trtexec flags: those given as options, then those of --trtexec-args. An option on the command
    line that is neither a trtexec flag the farm takes nor the command's own (--waitt, --fp61) is a usage error, as
    click reports any unknown option (exit 2), with the nearest of both kinds."""
    own = [o for p in ctx.command.params for o in getattr(p, "opts", []) if o.startswith("--")]
    for arg in ctx.args:
        flag = arg.partition("=")[0]
        if flag.startswith("--") and flag not in TRTEXEC_FLAGS:
            near = difflib.get_close_matches(flag, [*own, *TRTEXEC_FLAGS], n=1, cutoff=0.6)
            raise UnknownOption(f"No such option: {flag}." + (f" Did you mean {near[0]}?" if near else ""), ctx)
    return [*ctx.args, *shlex.split(trtexec_args or "")]


# ------------------------------------------------------------------------------------------------ waiting


def _transient(exc: Exception) -> bool:
    return isinstance(exc, httpx.TransportError) or (isinstance(exc, ApiError) and exc.status_code in TRANSIENT_STATUS)


def wait_or_fail(
    client: Client, build: dict[str, Any], timeout: float, log: Log = log_line, poll: float = 1.0
) -> tuple[dict[str, Any], int]:
    """Wait for every task of ``build`` until ``timeout`` seconds pass, logging each task's state change; returns
    the last state seen and the exit code: 0 when every target built, 1 when one failed or the deadline passed
    (a task still waiting is named with why, e.g. no live worker serves its target)."""
    deadline = time.monotonic() + timeout
    seen: dict[int, tuple[str, str | None]] = {}
    tag: str | None = None  # the last answer's: each request waits at the farm for the next (a long poll)
    while True:
        try:
            changed, tag = client.get_changed(
                f"/v1/builds/{build['id']}", tag, min(BUILD_WAIT_S, max(0.0, deadline - time.monotonic()))
            )
            build = changed or build
        except Exception as exc:
            if not _transient(exc) or time.monotonic() > deadline:
                raise
            log(f"build {build['id']}: the farm did not answer ({exc}); asking again")
            tag = None
        for t in build["tasks"]:
            now = (t["state"], t.get("error") or t.get("status_detail"))
            if seen.get(t["id"]) != now:
                seen[t["id"]] = now
                log(f"build {build['id']} {t['target']}: {t['state']}" + (f" ({now[1]})" if now[1] else ""))
        open_tasks = [t for t in build["tasks"] if t["state"] not in FINAL_STATES]
        if not open_tasks:
            failed = [t for t in build["tasks"] if t["state"] != "succeeded"]
            for t in failed:
                log(f"build {build['id']} {t['target']}: {t['state']}: {t.get('error') or 'no reason recorded'}")
            return build, 1 if failed else 0
        if time.monotonic() > deadline:
            for t in open_tasks:
                why = t.get("status_detail") or t["state"]
                log(f"build {build['id']} {t['target']}: not done after {timeout:g} s: {why}")
            return build, 1
        if tag is None:  # a farm that does not wait, or one that did not answer
            time.sleep(poll)


def _refused(options: CiOptions, reason: str, model: dict[str, Any] | None = None) -> dict[str, Any]:
    """A gate answer for a run the farm refused before anything was built: every target's build fails with the
    farm's reason, and the checks after it with it."""
    checks = (CHECKS[0], REPAIR, *CHECKS[1:]) if options.repair else CHECKS
    targets = [
        {
            "target": t,
            "verdict": "fail",
            "build_id": None,
            "task_id": None,
            "engine_id": None,
            "spec_hash": None,
            "checks": [
                {
                    "target": t,
                    "check": c,
                    "verdict": "fail",
                    "in_progress": False,
                    "numbers": {},
                    "reason": reason if c == "build" else "no engine: the build did not succeed",
                }
                for c in checks
            ],
        }
        for t in options.targets
    ]
    ident = (
        {k: model[k] for k in ("id", "name", "version")}
        if model
        else {"id": None, "name": options.name, "version": options.version or "?"}
    )
    return {
        "model": ident,
        "previous": None,
        "max_regression_pct": options.max_regression_pct,
        "pending": options.pending,
        "verdict": "fail",
        "reason": reason,
        "counts": {"pass": 0, "fail": len(checks) * len(targets), "pending": 0},
        "targets": targets,
    }


def _past_deadline(gate: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The gate once the deadline has passed: what is still under way, or not built, fails with its reason."""
    for target in gate["targets"]:
        for c in target["checks"]:
            if c["verdict"] == "pending" and (c["in_progress"] or c["check"] == "build"):
                why = c["reason"].removeprefix("waiting: ")
                c.update(verdict="fail", reason=f"not done after {timeout:g} s: {why}")
                target["verdict"] = "fail"
    return recount(gate, failed=True)


def _wait_gate(client: Client, options: CiOptions, model_id: int, build_id: int, log: Log) -> dict[str, Any]:
    deadline = time.monotonic() + options.timeout
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    params = {"build_id": build_id, "max_regression_pct": options.max_regression_pct, "pending": options.pending}
    gate = None
    while True:
        try:
            gate = client.get(f"/v1/models/{model_id}/gate", **params)
        except (ApiError, httpx.TransportError) as exc:
            if getattr(exc, "body", None) == {"detail": "Not Found"}:  # no such route, not no such model
                raise ApiError(
                    404,
                    {
                        "detail": f"the farm at {client.base_url} has no release gate "
                        "(GET /v1/models/{id}/gate): upgrade the farm"
                    },
                ) from None
            if not _transient(exc) or (gate is None and time.monotonic() > deadline):
                raise
            log(f"the farm did not answer ({exc}); asking again")
        else:
            for target in gate["targets"]:
                for c in target["checks"]:
                    now = (c["verdict"], c["reason"])
                    if seen.get((c["target"], c["check"])) != now:
                        seen[(c["target"], c["check"])] = now
                        log(f"{c['target']} {c['check']}: {c['verdict']}: {c['reason']}")
            if gate["verdict"] != "pending":
                return cast("dict[str, Any]", gate)
        if time.monotonic() > deadline and gate is not None:
            return _past_deadline(gate, options.timeout)
        time.sleep(options.poll)


def run_ci(client: Client, options: CiOptions, log: Log = log_line) -> CiResult:
    """Upload, build, wait, gate; writes the JUnit XML and Markdown summary the options name."""
    log(f"upload {options.model_file} as {options.name}" + (f" version {options.version}" if options.version else ""))
    model, step = None, "upload"
    try:
        model, created = client.upload(options.model_file, options.name, options.version, project=options.project)
        log(
            f"model {model['id']}: {model['name']} version {model['version']} sha256 {model['sha256'][:12]} "
            + ("uploaded" if created else "already uploaded (same bytes): reused")
        )
        if options.samples:
            step = "samples"
            model = client.upload_samples(model["id"], options.samples)
            log(f"samples: {model['samples']['count']} per input, sha256 {model['samples']['sha256'][:12]}")
        step = "build"
        build = client.build(model["id"], options.targets, options.spec, queue_without_worker=True)
    except ApiError as exc:
        if exc.status_code >= 500:
            raise
        gate = _refused(options, f"the farm refused the {step}: {_api_detail(exc)}", model)
        log(f"gate: fail: {gate['reason']}")
        return _finish(options, CiResult(gate, 1, model))
    log(
        f"build {build['id']}: {len(build['tasks'])} target(s), spec {build['spec_hash'][:12]}; "
        f"deadline {options.timeout:g} s"
    )
    gate = _wait_gate(client, options, model["id"], build["id"], log)
    if options.repair:
        gate = with_repair(gate, client.get(f"/v1/builds/{build['id']}"))
        for target in gate["targets"][:1]:  # the repair is one for every target
            c = next(c for c in target["checks"] if c["check"] == REPAIR)
            log(f"{REPAIR}: {c['verdict']}: {c['reason']}")
    log(f"gate: {gate['verdict']}: {gate['reason']}")
    return _finish(options, CiResult(gate, 0 if gate["verdict"] == "pass" else 1, model, build["id"]))


def _api_detail(exc: ApiError) -> str:
    detail = str(exc).removeprefix(f"HTTP {exc.status_code}: ")
    problems = [
        f"{'.'.join(str(p) for p in pr.get('loc', [])) or pr.get('target', '')}: {pr.get('msg') or pr.get('reason')}"
        for pr in (exc.problems or [])
        if isinstance(pr, dict)
    ]
    return detail + (f" ({'; '.join(problems)})" if problems else "")


def _finish(options: CiOptions, result: CiResult) -> CiResult:
    if options.junit:
        write_text(options.junit, junit_xml(result.gate, options.pending))
    if options.summary:  # appended: a CI's job summary file collects every step's
        write_text(options.summary, markdown_summary(result.gate, result.build_id), append=True)
    return result


# ------------------------------------------------------------------------------------------------ command


def ci_command(
    ctx: typer.Context,
    model_file: Path = typer.Argument(..., exists=True, dir_okay=False, help=".onnx file or .zip/.tar bundle"),
    name: str = typer.Option(..., "--name", help="the model's name in the catalog; each new file is a new version"),
    target: list[str] = typer.Option(..., "--target", "-t", help="e.g. onnxruntime/cpu-x86_64; repeat for more"),
    precision: str | None = typer.Option(None, help=PRECISION_HELP),
    trtexec_args: str | None = TRTEXEC_ARGS_OPT,
    spec_file: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="a JSON build spec; flags override its fields"
    ),
    version: str | None = typer.Option(None, help="the version to upload as (default: the next integer)"),
    project: str | None = typer.Option(None, help="the project it belongs to"),
    timeout: float = typer.Option(1800.0, "--timeout", min=1, help="seconds to wait for builds and checks in all"),
    max_regression_pct: float = typer.Option(
        10.0,
        "--max-regression-pct",
        min=0,
        help="largest median-latency slowdown against the previous version (same target, shape and GPU), in percent",
    ),
    pending: str = typer.Option(
        "pass", "--pending", help="pass or fail: how a check waiting for hardware the farm lacks counts"
    ),
    junit: Path | None = typer.Option(None, "--junit", help="write JUnit XML here (one case per target × check)"),
    summary: Path | None = typer.Option(
        None, "--summary", help="append a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)"
    ),
    samples: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help=".npz of sample inputs: int8 calibration and accuracy checks"
    ),
    repair: bool = typer.Option(
        False,
        "--repair",
        help="int8 or fp16: if it fails its accuracy gate, keep the fewest layers that break it in fp32 (found by "
        "measured sensitivity); the run fails when that repair does not reach a passing gate",
    ),
    api: str | None = typer.Option(
        None, "--api", envvar="ENGINEFARM_API_URL", help="farm URL (default http://127.0.0.1:8321)"
    ),
    token: str | None = typer.Option(None, "--token", envvar="ENGINEFARM_TOKEN", help="API token"),
) -> None:
    """Upload a model, build it for every target, wait for its checks and gate it: exit 0 only when every
    target built, was benchmarked (or waits for hardware the farm lacks, with --pending pass), passed its
    accuracy check and did not slow down beyond --max-regression-pct against the previous version (and, with
    --repair, the int8 or fp16 accuracy repair reached a passing gate)."""
    if pending not in ("pass", "fail"):
        raise typer.BadParameter("write pass or fail", param_hint="--pending")
    try:
        spec = build_spec(spec_file, precision, trtexec_flags(ctx, trtexec_args))
    except ValueError as exc:  # json.JSONDecodeError is one
        raise typer.BadParameter(str(exc), param_hint="--spec-file/trtexec flags") from None
    if repair:
        spec["accuracy_repair"] = True
    options = CiOptions(
        model_file=model_file,
        name=name,
        targets=target,
        spec=spec,
        version=version,
        project=project,
        timeout=timeout,
        max_regression_pct=max_regression_pct,
        pending=pending,
        junit=junit,
        summary=summary,
        samples=samples,
        repair=repair,
    )
    try:
        with Client(api, token=token) as client:
            result = run_ci(client, options)
    except httpx.TransportError as exc:
        log_line(f"error: cannot reach the farm at {api or 'ENGINEFARM_API_URL / http://127.0.0.1:8321'} ({exc})")
        raise typer.Exit(2) from None
    except (ApiError, UnsafePath) as exc:  # UnsafePath: --junit or --summary refused (a symbolic link)
        log_line(f"error: {exc}")
        raise typer.Exit(2) from None
    raise typer.Exit(result.exit_code)


ci_command.__doc__ = (ci_command.__doc__ or "") + TRTEXEC_HELP
