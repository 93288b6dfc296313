"""``ls``: what the catalog holds (models, engines, builds, live workers), as tables. Registered on the
``enginefarm`` app by ``enginefarm.client.cli``."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from enginefarm.client.terminal import API_OPT, console, farm_call, print_tasks

ls_app = typer.Typer(help="List what the catalog holds.", no_args_is_help=True)


@ls_app.command("models")
def ls_models(
    name: str | None = typer.Option(None, help="only the versions of this model"), api: str | None = API_OPT
) -> None:
    """Models and their versions, with their inputs."""
    with farm_call(api) as c:
        page = c.models(name=name, limit=500)
    table = Table(title=f"models ({page['total']})")
    for col in ("id", "name", "version", "sha256", "size", "opset", "inputs"):
        table.add_column(col)
    for m in page["items"]:
        inputs = ", ".join(f"{i['name']}{i['dims']}" for i in m["inputs"])
        table.add_row(str(m["id"]), m["name"], m["version"], m["sha256"][:12], str(m["size"]), str(m["opset"]), inputs)
    console.print(table)


def engines_table(items: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for col in ("id", "model", "target", "cc", "precision", "runtime", "platform", "size", "build s", "sha256"):
        table.add_column(col)
    for e in items:
        cc = e["compute_capability"] or ",".join(e["compute_capabilities"]) or "cpu"
        table.add_row(
            str(e["id"]),
            f"{e['model_name']} v{e['model_version']}",
            e["target"],
            cc,
            e["precision"],
            e["trt_version"] or f"ort {e['backend_version']}",
            e["platform"],
            str(e["size"]),
            f"{e['build_seconds']:.2f}",
            e["sha256"][:12],
        )
    return table


@ls_app.command("engines")
def ls_engines(
    model: str | None = typer.Option(None, help="only this model's engines (its name)"),
    target: str | None = typer.Option(None, help="only this target, e.g. tensorrt-rtx/sm86"),
    cc: str | None = typer.Option(None, help="only engines that run on this compute capability"),
    precision: str | None = typer.Option(None, help="only this precision"),
    api: str | None = API_OPT,
) -> None:
    """Engines in the catalog, with what they were built for."""
    with farm_call(api) as c:
        page = c.engines(model=model, target=target, cc=cc, precision=precision, limit=500)
    console.print(engines_table(page["items"], f"engines ({page['total']})"))


@ls_app.command("builds")
def ls_builds(
    model: str | None = typer.Option(
        None, "--model", help="only this model's builds: id, name (its newest version) or name:version"
    ),
    limit: int = typer.Option(20, "--limit", min=1, max=500, help="at most this many, newest first"),
    api: str | None = API_OPT,
) -> None:
    """Builds, newest first, each with its targets' states."""
    with farm_call(api) as c:
        builds = c.builds(model_id=c.model_id(model) if model else None, limit=limit)
        for b in builds:
            print_tasks(b)
        if not builds:
            console.print("no builds" + (f" of {model}" if model else ""))


@ls_app.command("workers")
def ls_workers(api: str | None = API_OPT) -> None:
    """Live workers and the targets each builds."""
    with farm_call(api) as c:
        live = c.workers()
    table = Table(title=f"live workers ({len(live)})")
    for col in ("id", "targets", "last seen"):
        table.add_column(col)
    for w in live:
        table.add_row(w["id"], ", ".join(w["targets"]), w["last_seen"])
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add ``ls`` to the ``enginefarm`` app."""
    app.add_typer(ls_app, name="ls")
