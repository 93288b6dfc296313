"""What every ``enginefarm`` command shares: its consoles, its farm client, how it fails (one line a user can act on,
never a traceback), its common options, and the extras a command needs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from enginefarm.core.spec import PRECISIONS

if TYPE_CHECKING:
    from enginefarm.client import Client

# Wide tables when piped (CI logs, the demo's output), the terminal's width otherwise.
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def client_for(api: str | None) -> Client:
    """A client of the farm at ``api`` (else ENGINEFARM_API_URL, else the default)."""
    from enginefarm.client import Client

    return Client(api)


@contextmanager
def farm_call(api: str | None) -> Iterator[Client]:
    """A client whose failures end the command with one line a user can act on, never a traceback."""
    try:
        with client_for(api) as c:
            yield c
    except typer.Exit:  # a command that ends itself (a missing extra's pip line, exit 2) ends as it said
        raise
    except Exception as exc:  # noqa: BLE001 - every failure is printed, then the command exits 1
        fail(exc)


# What a fingerprint field's pattern asks for, in words (pydantic would print the regular expression).
PATTERN_WORDS = {
    "compute_capability": "a compute capability is major.minor, e.g. 8.6 (not 86 or sm86)",
    "platform": "x86_64 or aarch64",
    "jetpack": "a JetPack release, e.g. 6.1",
    **{
        name: f"a version of dotted numbers, e.g. {example}"
        for name, example in (
            ("driver_version", "580.82.07"),
            ("cuda_version", "12.8"),
            ("trt_version", "10.3.0"),
            ("trt_rtx_version", "1.7.1.116"),
            ("ort_version", "1.23.2"),
        )
    },
}


def fail(exc: Exception) -> None:
    import httpx

    if isinstance(exc, httpx.TransportError):
        try:  # where the request went: --api, else ENGINEFARM_API_URL, else the default
            url = f"{exc.request.url.scheme}://{exc.request.url.netloc.decode()}"
        except RuntimeError:  # an error raised before any request was made
            url = os.environ.get("ENGINEFARM_API_URL") or "http://127.0.0.1:8321"
        err.print(
            f"[red]error:[/red] cannot reach the farm at {url} ({exc}); it is looked for at --api or "
            f"ENGINEFARM_API_URL; `enginefarm up` starts one"
        )
        raise typer.Exit(1)
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):  # a fingerprint flag (--cc, --driver, ...) the rules cannot take
        err.print(f"[red]error:[/red] {exc.error_count()} value(s) cannot be used:")
        for e in exc.errors():
            field = ".".join(str(x) for x in e["loc"])
            said = (
                PATTERN_WORDS.get(str(e["loc"][-1]), e["msg"]) if e["type"] == "string_pattern_mismatch" else e["msg"]
            )
            err.print(f"  - {field}: {said}", highlight=False)
        raise typer.Exit(1)
    err.print(f"[red]error:[/red] {getattr(exc, 'message', exc)}", soft_wrap=True)  # one line, however long
    for problem in getattr(exc, "problems", None) or []:
        where = ".".join(str(p) for p in problem.get("loc", [])) or engine_words(problem)
        err.print(f"  - {where}: {problem.get('msg') or problem.get('reason')}", highlight=False)
    if getattr(exc, "status_code", None) == 401:  # the farm speaks HTTP; a CLI user gives the token thus
        given = "ENGINEFARM_TOKEN is set" if os.environ.get("ENGINEFARM_TOKEN") else "no ENGINEFARM_TOKEN is set"
        err.print(f"  the CLI sends the token in ENGINEFARM_TOKEN or --token TOKEN ({given})", highlight=False)
    raise typer.Exit(1)


def engine_words(problem: dict[str, Any]) -> str:
    """An engine a resolve answer names, told apart from its siblings: "engine 12 (tensorrt-rtx/sm86 fp16, v2)"."""
    what = " ".join(str(problem[k]) for k in ("target", "precision") if problem.get(k))
    version = problem.get("version") or problem.get("model_version")
    what += f", v{version}" if version else ""
    return f"engine {problem['engine_id']} ({what})" if problem.get("engine_id") is not None else what


PRECISION_HELP = f"{PRECISIONS[0]} (default), {', '.join(PRECISIONS[1:-1])} or {PRECISIONS[-1]}"
API_OPT = typer.Option(None, "--api", envvar="ENGINEFARM_API_URL", help="farm URL (default http://127.0.0.1:8321)")
QUEUE_OPT = typer.Option(
    False, "--queue-without-worker", help="queue targets no live worker serves now, to wait for one (default: refused)"
)


def transfer_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err)


# Where a command's extra is missing, the pip line that adds it.
EXTRA_MODULES = {
    "server": ("fastapi", "sqlalchemy", "alembic", "boto3", "uvicorn"),
    "worker": ("celery", "onnx", "onnxruntime", "numpy"),
    "rtx": ("tensorrt_rtx",),
    "plot": ("matplotlib",),
    # enginefarm measure: a deploy machine's runtime for each kind of engine (enginefarm.measure.cli)
    "measure-ort": ("numpy", "onnxruntime"),
    "measure-cuda": ("numpy", "onnxruntime", "cuda.bindings"),
    "measure-rtx": ("numpy", "tensorrt_rtx", "cuda.bindings"),
    "measure-trt": ("numpy", "tensorrt", "cuda.bindings"),
}


def missing_extras(*extras: str) -> list[str]:
    """Those of ``extras`` whose packages are not all installed here."""
    from importlib.util import find_spec

    return [extra for extra in extras if any(find_spec(module) is None for module in EXTRA_MODULES[extra])]


def need(*extras: str) -> None:
    """End the command with the pip line to run when any of ``extras`` is not installed."""
    if missing := missing_extras(*extras):
        from rich.markup import escape

        names = ", ".join(repr(m) for m in missing)
        err.print(
            escape(
                f"error: this command needs the {names} extra{'s' if len(missing) > 1 else ''}: "
                f"pip install 'enginefarm[{','.join(missing)}]'"
            )
        )
        raise typer.Exit(2)


def print_tasks(build: dict[str, Any]) -> None:
    table = Table(
        title=f"build {build['id']} of model {build['model_id']}, {build['state']}, {build['created_at'][:19]}"
    )
    for col in ("target", "precision", "state", "engine", "wait s", "run s", "note"):
        table.add_column(col)
    for t in build["tasks"]:
        note = (
            t["error"]
            or t["status_detail"]
            or t.get("precision_note")
            or ("reused an identical build" if t["reused"] else "")
        )
        table.add_row(
            t["target"],
            t.get("precision") or "",
            t["state"],
            str(t["engine_id"] or ""),
            secs(t["wait_seconds"]),
            secs(t["run_seconds"]),
            note,
        )
    console.print(table)


def print_quantize(build: dict[str, Any]) -> None:
    """What the int8 stage of a build did: the CPU candidates measured and the one kept, and the accuracy repair."""
    reports = (build.get("quantize") or {}).get("reports") or {}
    cpu = reports.get("onnxruntime") or {}
    if cpu.get("candidates"):
        table = Table(title="int8 on the CPU: the candidates measured on the worker (speed-up against fp32)")
        for col in ("candidate", "speed-up", "cosine", "gate", "kept"):
            table.add_column(col)
        for c in cpu["candidates"]:
            if "error" in c:
                table.add_row(c["name"], "", "", "did not quantize", "")
                continue
            table.add_row(
                c["name"],
                f"{c['speedup']:.2f}x",
                f"{c['cosine']:.4f}",
                "pass" if c["pass"] else "FAIL",
                c.get("why", "") if c.get("kept") else "",
            )
        console.print(table)
    repair = next((r["repair"] for r in reports.values() if r.get("repair")), None)
    if repair is None:
        return
    if repair.get("precision") == "fp16":
        print_fp16_repair(repair)
        return
    before, after = repair["before"], repair["after"]
    if not repair["needed"]:
        console.print(
            f"repair: not needed (the {repair.get('recipe', 'operator')} form's cosine {before['cosine']:.4f} passes "
            "the int8 gate; every CPU form above was gated again before one was kept)"
        )
    elif repair.get("form"):
        console.print(
            f"repair: the {repair['form']} form passes ({repair['evaluations']} checks{_cost(repair)}): "
            f"{repair.get('note', '')}"
        )
    elif repair["passed"]:
        console.print(
            f"repair: kept {', '.join(repair['kept'])} in fp32; cosine {before['cosine']:.4f} -> "
            f"{after['cosine']:.4f} ({repair['evaluations']} checks, {repair['seconds']:.1f} s{_cost(repair)})"
        )
    else:
        console.print(f"[red]repair failed:[/red] {repair.get('note', '')}")
    if lat := repair.get("latency_ms"):
        speedup = repair.get("speedup") or {}
        figures = [f"fp32 {lat['fp32']:.4g} ms"] + [
            f"int8 {label} {lat[k]:.4g} ms ({speedup[k]:.2f}x)"
            for k, label in (("unrepaired", "without repair"), ("repaired", "repaired"))
            if lat.get(k) is not None and speedup.get(k)
        ]
        console.print("repair: CPU latency, median of one run: " + ", ".join(figures))
    if u := repair.get("unrepaired"):
        console.print(
            f"repair: int8 without repair kept as model {u['model_id']} version {u['version']} "
            f"(cosine {u['accuracy']['cosine']:.4f}, {'pass' if u['accuracy']['pass'] else 'fail'})"
        )
    if repair.get("speed_note"):
        console.print(
            f"[yellow]repair: not faster than fp32:[/yellow] {repair['speed_note']} "
            f"(recommended: {repair.get('recommend') or 'fp32'})"
        )


def fp16_change(repair: dict[str, Any]) -> str:
    """ "100.00% (inf/NaN) -> 0.00% of output elements outside the fp16 tolerance, cosine -1.0000 -> 1.0000" from a
    build's fp16 repair report."""
    from enginefarm.client.int8view import share

    before, after = repair["before"], repair["after"]
    return (
        f"{share(before)} -> {share(after)} of output elements outside the fp16 tolerance, cosine "
        f"{before['cosine']:.4f} -> {after['cosine']:.4f}"
    )


def _cost(repair: dict[str, Any]) -> str:
    """The repair's cost in accuracy checks of the model, where the report has it."""
    cost = repair.get("cost_in_checks")
    return f", {cost:g}x one check of {repair['check_seconds']:.1f} s" if cost is not None else ""


def print_fp16_repair(repair: dict[str, Any]) -> None:
    """The fp16 accuracy repair of a build: the nodes kept in fp32 and the gate before and after, or why it stopped."""
    if not repair["needed"]:
        console.print(f"fp16 repair: not needed (fp16 passes its accuracy gate as converted; {fp16_change(repair)})")
    elif repair["passed"]:
        console.print(
            f"fp16 repair: kept {', '.join(repair['kept'])} in fp32; {fp16_change(repair)} "
            f"({repair['evaluations']} checks, {repair['seconds']:.1f} s{_cost(repair)})"
        )
    else:
        console.print(f"[red]fp16 repair failed:[/red] {repair.get('note', '')}")
    if repair.get("needed") and repair.get("measured_on"):
        console.print(f"[dim]fp16 repair: measured on {repair['measured_on']}[/dim]")


def secs(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"
