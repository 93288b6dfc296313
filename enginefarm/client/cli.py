"""The ``enginefarm`` command line (typer + rich)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table

from enginefarm.client import fetchcli, lscli
from enginefarm.client.ci import TRTEXEC_ARGS_OPT, TRTEXEC_CONTEXT, TRTEXEC_HELP, build_spec, ci_command, trtexec_flags
from enginefarm.client.terminal import (
    API_OPT,
    PRECISION_HELP,
    QUEUE_OPT,
    client_for,
    console,
    err,
    fail,
    farm_call,
    need,
    print_quantize,
    print_tasks,
    transfer_bar,
)
from enginefarm.core.shapes import parse_val_ranges

if TYPE_CHECKING:
    from enginefarm.client import Client

app = typer.Typer(
    help="enginefarm: build TensorRT engines for every GPU, fetch the one that runs here.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _version(show: bool) -> None:
    if show:
        from enginefarm import __version__

        print(f"enginefarm {__version__}")
        raise typer.Exit()


@app.callback()
def _global(
    token: str | None = typer.Option(
        None, "--token", envvar="ENGINEFARM_TOKEN", show_envvar=True, help="API token for the farm's REST API"
    ),
    api: str | None = typer.Option(
        None, "--api", help="farm URL for any command (as each command's own --api or ENGINEFARM_API_URL)"
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    if token:  # the client reads it from the environment
        os.environ["ENGINEFARM_TOKEN"] = token
    if api:  # each command's --api reads ENGINEFARM_API_URL when it is not given after the command
        os.environ["ENGINEFARM_API_URL"] = api


@app.command()
def upload(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help=".onnx file or .zip/.tar bundle"),
    name: str = typer.Option(..., help="the model's name in the catalog"),
    version: str | None = typer.Option(None, help="the version to upload as (default: the next integer)"),
    project: str | None = typer.Option(None, help="the project it belongs to (a project's token puts it in its own)"),
    samples: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help=".npz of sample inputs: int8 calibration and accuracy checks"
    ),
    api: str | None = API_OPT,
) -> None:
    """Upload an .onnx file, or a .zip/.tar bundle of model.onnx and its external data."""
    with farm_call(api) as c:
        with transfer_bar() as bar:
            tasks: list[TaskID] = []  # the bar shows once the first byte goes, not before a refusal

            def sent(n: int) -> None:
                if not tasks:
                    tasks.append(bar.add_task(f"upload {file.name}", total=file.stat().st_size))
                bar.advance(tasks[0], n)

            model, created = c.upload(file, name, version, on_bytes=sent, project=project)
        if samples:
            model = c.upload_samples(model["id"], samples)
    console.print(
        f"{'uploaded' if created else 'already present'}: model {model['id']} "
        f"{model['name']} v{model['version']} sha256 {model['sha256'][:12]}"
    )
    if model.get("samples"):
        console.print(f"samples: {model['samples']['count']} per input, sha256 {model['samples']['sha256'][:12]}")


@app.command(context_settings=TRTEXEC_CONTEXT)
def build(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="model id, name (its newest version) or name:version"),
    target: list[str] = typer.Option(..., "--target", "-t", help="e.g. tensorrt-rtx/sm86; repeat for more"),
    precision: str | None = typer.Option(None, help=PRECISION_HELP),
    trtexec_args: str | None = TRTEXEC_ARGS_OPT,
    spec_file: Path | None = typer.Option(None, help="a JSON build spec; flags override its fields"),
    batch_sizes: str | None = typer.Option(None, "--batch-sizes", help="benchmark at these batch sizes, e.g. 1,8,32"),
    bench_seconds: float | None = typer.Option(None, "--bench-seconds", help="minimum measured time (default 3)"),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="benchmark GPU engines through a CUDA graph"),
    no_bench: bool = typer.Option(False, "--no-bench", help="build only: no benchmark, no accuracy check"),
    val_range: list[str] | None = typer.Option(
        None, "--val-range", help="generated input values, Polygraphy syntax: input_ids:[0,30521] (repeatable)"
    ),
    keep_fp32_ops: str | None = typer.Option(
        None, "--keep-fp32-ops", help="fp16/int8: op types kept fp32, e.g. Softmax,Pow"
    ),
    keep_fp32_layers: str | None = typer.Option(None, "--keep-fp32-layers", help="fp16/int8: node names kept fp32"),
    repair: bool = typer.Option(
        False,
        "--repair",
        help="int8 or fp16: if it fails its accuracy gate, keep the fewest "
        "layers that break it in fp32 (found by measured sensitivity)",
    ),
    cleanup: str | None = typer.Option(None, "--cleanup", help="graph clean-up before building: onnxslim or none"),
    calibration: str | None = typer.Option(None, "--calibration", help="int8: minmax, entropy or percentile"),
    queue_without_worker: bool = QUEUE_OPT,
    wait: bool = typer.Option(False, "--wait", help="wait for every target and show progress"),
    timeout: float = typer.Option(
        3600, "--timeout", min=1, help="with --wait: give up after this many seconds (exit 1)"
    ),
    api: str | None = API_OPT,
) -> None:
    """Build a model for one or more targets; each engine is then benchmarked and checked against ONNX Runtime."""
    flags = trtexec_flags(ctx, trtexec_args)  # a misspelt option of this command is a usage error (exit 2)
    try:
        spec = build_spec(spec_file, precision, flags)
        _bench_flags(spec, batch_sizes, bench_seconds, cuda_graph, no_bench)
        _precision_flags(spec, val_range, keep_fp32_ops, keep_fp32_layers, cleanup, calibration)
        if repair:
            spec["accuracy_repair"] = True
        with client_for(api) as c:
            result: dict[str, Any] = c.build(model, target, spec, queue_without_worker=queue_without_worker or None)
            console.print(f"build {result['id']} queued: {len(result['tasks'])} target(s)")
            if wait and sys.stderr.isatty():
                result = _wait_with_progress(c, result, timeout)
            elif wait:  # a CI log: one timestamped line per change instead of a redrawn bar
                from enginefarm.client.ci import wait_or_fail

                result, _ = wait_or_fail(c, result, timeout)
    except Exception as exc:  # noqa: BLE001 - every failure is printed in one line, then the command exits 1
        fail(exc)
    print_tasks(result)
    if wait:
        print_quantize(result)
    if result.get("summary"):
        console.print(result["summary"])
    if any(t["state"] != "succeeded" for t in result["tasks"]) and wait:
        raise typer.Exit(1)


build.__doc__ = (build.__doc__ or "") + TRTEXEC_HELP


def _precision_flags(
    spec: dict[str, Any],
    val_range: list[str] | None,
    ops: str | None,
    layers: str | None,
    cleanup: str | None,
    calibration: str | None,
) -> None:
    if val_range:
        spec.setdefault("benchmark", {}).setdefault("value_ranges", {}).update(parse_val_ranges(val_range))
    if ops:
        spec["keep_fp32_ops"] = [o.strip() for o in ops.split(",") if o.strip()]
    if layers:
        spec["keep_fp32_layers"] = [n.strip() for n in layers.split(",") if n.strip()]
    if cleanup:
        spec["graph_cleanup"] = cleanup
    if calibration:
        spec.setdefault("calibration", {})["method"] = calibration


@app.command()
def logs(
    build_id: int,
    target: str | None = typer.Option(None, "--target", "-t", help="only this target"),
    api: str | None = API_OPT,
) -> None:
    """Print the builder log of each task of a build (the log's tail as the worker kept it), and its error."""
    with farm_call(api) as c:
        build = c.get(f"/v1/builds/{build_id}")
    tasks = [t for t in build["tasks"] if target in (None, t["target"])]
    if not tasks:
        console.print(f"[red]build {build_id} has no task for {target}; its targets: {', '.join(build['targets'])}")
        raise typer.Exit(1)
    for t in tasks:
        console.rule(f"{t['target']}: {t['state']}")
        console.print(t["log_tail"] or "(no log yet)", markup=False, highlight=False, soft_wrap=True)
        if t["error"]:
            console.print(f"error: {t['error']}", markup=False, highlight=False, soft_wrap=True)


def _bench_flags(
    spec: dict[str, Any], batch_sizes: str | None, seconds: float | None, cuda_graph: bool, off: bool
) -> None:
    bench = spec.setdefault("benchmark", {})
    if batch_sizes:
        bench["batch_sizes"] = [int(b) for b in batch_sizes.split(",") if b.strip()]
    if seconds is not None:
        bench["duration_s"] = seconds
    if cuda_graph:
        bench["cuda_graph"] = True
    if off:
        bench["enabled"] = False
        spec.setdefault("accuracy", {})["enabled"] = False


@app.command(context_settings=TRTEXEC_CONTEXT)
def sweep(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="model id, name (its newest version) or name:version"),
    target: list[str] = typer.Option(..., "--target", "-t", help="e.g. tensorrt-rtx/sm86; repeat for more"),
    axis: list[str] = typer.Option(
        ..., "--axis", "-a", help="FIELD=V1,V2: precision=fp32,fp16 or optimization_level=3,5"
    ),
    spec_file: Path | None = typer.Option(None, help="the JSON base spec every variant starts from"),
    queue_without_worker: bool = QUEUE_OPT,
    wait: bool = typer.Option(False, "--wait", help="wait for builds and benchmarks, then print the variants"),
    trtexec_args: str | None = TRTEXEC_ARGS_OPT,
    api: str | None = API_OPT,
) -> None:
    """Build and benchmark every combination of the axes; the best variant per target is the fastest that
    passes the accuracy gate. The base spec: --spec-file, then trtexec's build flags (--shapes=..., as `build`
    takes them)."""
    flags = trtexec_flags(ctx, trtexec_args)  # a misspelt option of this command is a usage error (exit 2)
    try:
        base = build_spec(spec_file, None, flags)
        axes: dict[str, list[Any]] = {}
        for item in axis:
            field, sep, values = item.partition("=")
            if not sep or not values:
                raise ValueError(f"--axis {item!r}: write FIELD=V1,V2")
            axes[field.strip()] = [
                json.loads(v) if v.strip().lstrip("-").isdigit() or v.strip() in ("true", "false") else v.strip()
                for v in values.split(",")
            ]
        with client_for(api) as c:
            result = c.sweep(c.model_id(model), target, axes, base, queue_without_worker=queue_without_worker or None)
            console.print(f"sweep {result['id']}: {len(result['variants'])} variant(s) × {len(target)} target(s)")
            if wait:
                for v in result["variants"]:
                    c.wait_build(v["build_id"])
                c.wait_checks(result["model_id"])
                result = c.get(f"/v1/sweeps/{result['id']}")
    except Exception as exc:  # noqa: BLE001 - every failure is printed in one line, then the command exits 1
        fail(exc)
    table = Table(title=f"sweep {result['id']}")
    for col in ("variant", "target", "state", "p50 ms", "p99 ms", "accuracy", "best"):
        table.add_column(col)
    for v in result["variants"]:
        for e in v["engines"]:
            acc = {True: "pass", False: "FAIL"}.get(e["accuracy_pass"], "—")
            table.add_row(
                v["variant"],
                e["target"],
                (e["checks"] or {}).get("detail") or e["task_state"],
                f"{e['median_ms']:.3f}" if e["median_ms"] is not None else "—",
                f"{e['p99_ms']:.3f}" if e["p99_ms"] is not None else "—",
                acc,
                "★" if e["best"] else "",
            )
    console.print(table)


@app.command()
def report(
    model: str = typer.Argument(..., help="model name, or a model id"),
    version: str | None = typer.Option(None, help="model version (default: the newest)"),
    plot: Path | None = typer.Option(None, "--plot", help="also draw latency by target and batch size to this PNG"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    wait: bool = typer.Option(False, "--wait", help="wait for benchmarks that are queued or running"),
    api: str | None = API_OPT,
) -> None:
    """Latency percentiles, throughput, accuracy and size for every target and shape, the change since the
    previous version, and the int8 accuracy repair of builds that asked for one."""
    from enginefarm.client.fleetview import fleet_table
    from enginefarm.client.int8view import repair_sections
    from enginefarm.client.report import plot_report, regression_table, report_table

    if plot:
        need("plot")
    with farm_call(api) as c:
        model_id = c.model_id(f"{model}:{version}" if version and not model.isdigit() else model)
        data = c.wait_checks(model_id) if wait else c.report(model_id)
        if as_json:
            console.print_json(json.dumps(data))
            return
        console.print(report_table(data))
        if (regression := regression_table(data)) is not None:
            console.print(regression)
        if (measured := fleet_table(data)) is not None:
            console.print(measured)
        for section in repair_sections(data):
            console.print(section)
        if plot:
            console.print(f"plot: {plot_report(data, plot)}")


def _wait_with_progress(c: Client, build: dict[str, Any], timeout: float) -> dict[str, Any]:
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[state]}"), console=err
    ) as bar:
        ids = {t["id"]: bar.add_task(t["target"], total=1, state=t["state"]) for t in build["tasks"]}

        def update(b: dict[str, Any]) -> None:
            for t in b["tasks"]:
                done = t["state"] in ("succeeded", "failed", "cancelled")
                bar.update(ids[t["id"]], completed=1 if done else 0, state=t["status_detail"] or t["state"])

        return c.wait_build(build["id"], timeout=timeout, on_update=update)


app.command("ci", context_settings=TRTEXEC_CONTEXT)(ci_command)
fetchcli.register(app)  # fetch, export
lscli.register(app)


GLOBAL = ("--token",)  # the farm-wide options a command's own options do not repeat
_TAKES_VALUE = ("--token", "--api")


def hoisted(argv: list[str]) -> list[str]:
    """``argv`` with each global option given after the command (``enginefarm ls models --token T``, as a user
    types it after --api) moved to just before the command, after any given before it, so that the last one given
    wins as it would in place; nothing after ``--`` is touched."""
    start = 0  # where the command is: past the global options given before it
    while start < len(argv) and argv[start].startswith("-"):
        start += 2 if argv[start] in _TAKES_VALUE else 1
    moved: list[str] = []
    rest: list[str] = []
    i = start
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i:]
            break
        if arg in GLOBAL and i + 1 < len(argv):
            moved += argv[i : i + 2]
            i += 2
            continue
        if "=" in arg and arg.split("=", 1)[0] in GLOBAL:
            moved.append(arg)
        else:
            rest.append(arg)
        i += 1
    return argv[:start] + moved + rest


def main() -> None:
    """``enginefarm``: the client commands, and the farm's own (``enginefarm.commands`` entry points)."""
    from importlib.metadata import entry_points

    for plugin in entry_points(group="enginefarm.commands"):
        plugin.load()(app)
    app(args=hoisted(sys.argv[1:]))


if __name__ == "__main__":
    main()
