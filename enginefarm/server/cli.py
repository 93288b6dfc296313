"""The farm's own commands: run the API, a worker, the reconciler and collector, an embedded farm, the demo, and
manage tokens. They need the server extras; ``enginefarm`` registers them through the ``enginefarm.commands``
entry point, and a command whose extra is missing says which to install."""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from rich.table import Table

from enginefarm.client.terminal import console, err, fail, need
from enginefarm.config import get_settings
from enginefarm.server.metricsdir import metrics_dir

app = typer.Typer()
token_app = typer.Typer(help="API tokens (works on the catalog database directly: run it where the farm's settings are).",
                        no_args_is_help=True)


# The extras each command needs besides [server].
NEEDS = {"worker": ("server", "worker"), "up": ("server", "worker"), "demo": ("server", "worker")}


def _needing(extras: tuple[str, ...], fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        need(*extras)
        return fn(*args, **kwargs)

    return run


def register(root: typer.Typer) -> None:
    """Add the server commands to the ``enginefarm`` command; each first checks that its extras are installed."""
    if any(group.name == "token" for group in root.registered_groups):
        return  # already added (the entry point loaded twice in one process)
    for command in app.registered_commands + token_app.registered_commands:
        name = command.name or command.callback.__name__
        command.callback = _needing(NEEDS.get(name, ("server",)), command.callback)
    root.add_typer(token_app, name="token")
    root.registered_commands.extend(app.registered_commands)


# ------------------------------------------------------------------------------ tokens


@token_app.command("create")
def token_create(scope: list[str] = typer.Option(..., "--scope", help="read, build or admin (repeatable)"),
                 name: str = typer.Option(..., help="who or what uses it"),
                 expires_days: Optional[float] = typer.Option(None, help="valid for this many days (default: until revoked)"),
                 project: Optional[str] = typer.Option(None, help="limit it to one project's models (default: the "
                                                                  "whole farm)"),
                 init: bool = typer.Option(False, "--init", help="make the catalog first if none is there yet")) -> None:
    """Make an API token. It is printed once, alone on stdout, and only its hash is stored."""
    from enginefarm.server.embedded import prepare
    from enginefarm.errors import EnginefarmError
    from enginefarm.storage.db import has_catalog, session_scope
    from enginefarm.storage.tokens import create_token, lifetime

    settings = get_settings()
    if not init and not has_catalog(settings):
        where = settings.database_url and "ENGINEFARM_DATABASE_URL's database" or f"{settings.data_dir / 'catalog.db'}"
        err.print(f"error: no farm's catalog at {where}, so no farm would know this token. Run it where the farm's "
                  f"settings are (ENGINEFARM_DATA_DIR or ENGINEFARM_DATABASE_URL), or pass --init to start a new "
                  f"catalog there.", highlight=False)
        raise typer.Exit(1)
    prepare(settings)
    try:
        expires = lifetime(expires_days)
        with session_scope(settings) as session:
            row, token = create_token(session, name, scope, expires, project)
    except EnginefarmError as exc:
        fail(exc)
    where = f" in project {row.project}" if row.project else ""
    err.print(f"token {row.id} '{row.name}' with scope {', '.join(row.scopes)}{where}; keep it now, it cannot be shown "
              f"again:")
    print(token)


@token_app.command("list")
def token_list() -> None:
    """Tokens with their scopes and state (never the tokens themselves)."""
    from enginefarm.storage.db import session_scope
    from enginefarm.storage.tokens import list_tokens, token_state

    table = Table(title="API tokens")
    for col in ("id", "name", "starts with", "scopes", "project", "state", "created", "last used"):
        table.add_column(col)
    with session_scope(get_settings()) as session:
        for r in list_tokens(session):
            table.add_row(str(r.id), r.name, r.prefix + "…", ", ".join(r.scopes), r.project or "(all)", token_state(r),
                          f"{r.created_at:%Y-%m-%d %H:%M}", f"{r.last_used_at:%Y-%m-%d %H:%M}" if r.last_used_at else "-")
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: int) -> None:
    """Revoke a token: requests with it get 401 from now on."""
    from enginefarm.errors import EnginefarmError
    from enginefarm.storage.db import session_scope
    from enginefarm.storage.tokens import revoke_token

    try:
        with session_scope(get_settings()) as session:
            row = revoke_token(session, token_id)
    except EnginefarmError as exc:
        fail(exc)
    console.print(f"token {row.id} '{row.name}' is revoked")


# ------------------------------------------------------------------------------ services


@app.command()
def api(host: str = typer.Option("127.0.0.1", help="address to listen on"),
        port: int = typer.Option(8321, help="port to listen on"),
        workers: int = typer.Option(1, help="uvicorn worker processes"),
        log_level: str = typer.Option("info", "--log-level", help="uvicorn's: debug, info, warning or error")) -> None:
    """Run the REST API (OpenAPI at /docs): uvicorn, its connections with TCP_NODELAY (no 40 ms Nagle waits
    under several workers). /metrics sums its worker processes (prometheus-client's multiprocess mode)."""
    from enginefarm.server.serve import serve_api

    metrics_dir(get_settings().data_dir / "metrics" / f"api-{port}")
    serve_api(host, port, workers, log_level)


@app.command()
def worker(
    probe: bool = typer.Option(False, "--probe", help="print what this machine can build, then exit"),
    targets: Optional[str] = typer.Option(None, help="comma-separated targets to serve instead of the probed ones"),
    bench_targets: Optional[str] = typer.Option(
        None, "--bench-targets", help="comma-separated targets whose engines to benchmark instead of the probed ones "
                                      "(engines this machine's GPU or CPU runs), or 'none'"),
    name: Optional[str] = typer.Option(None, help="worker name (default: the hostname)"),
    concurrency: int = typer.Option(None, help="parallel builds (default ENGINEFARM_WORKER_CONCURRENCY or 1)"),
    pool: str = typer.Option("prefork", help="Celery pool: prefork isolates builds in child processes"),
    loglevel: str = typer.Option("info", help="Celery's log level: debug, info, warning or error"),
    lane: str = typer.Option("both", hidden=True, help="'benchmarks': run as the benchmark lane of the worker "
                                                        "named by ENGINEFARM_LANE_OF (the worker starts it itself)"),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port",
                                               help="serve Prometheus metrics (build and benchmark seconds per "
                                                    "target) on this port"),
) -> None:
    """Probe this machine, then consume the build queues of exactly the targets it can build and the
    benchmark queues of exactly the targets whose engines it can run. Builds and benchmarks run in separate
    pools (a second Celery worker process for the benchmarks), so a build never waits behind a benchmark."""
    from enginefarm.probe.machineprobe import probe_machine
    from enginefarm.probe.policy import benchmark_targets, buildable_targets
    from enginefarm.probe.report import probe_report

    settings = get_settings()
    machine = probe_machine()
    if probe:
        console.print_json(json.dumps(machine.to_dict()))
        for line in probe_report(machine):
            console.print(line, highlight=False)
        return
    from enginefarm.domain import Target
    from enginefarm.workerid import check_worker_name

    def parse(text: str) -> list[Target]:
        return [] if text.strip() == "none" else [Target.parse(t) for t in text.split(",") if t.strip()]

    chosen_text = targets or settings.worker_targets
    bench_text = bench_targets or settings.worker_bench_targets
    try:
        chosen = parse(chosen_text) if chosen_text else buildable_targets(machine)
        bench = parse(bench_text) if bench_text else benchmark_targets(machine)
        name = check_worker_name(name or socket.gethostname())
    except ValueError as exc:
        fail(exc)
    if not chosen and not bench:
        fail(RuntimeError("this machine can build no target and run no engine; see `enginefarm worker --probe`"))
    if metrics_port is not None and lane == "both":
        metrics_dir(settings.data_dir / "metrics" / f"worker-{name}-{os.getpid()}")  # the lane inherits it
        from enginefarm.worker import metrics  # after the folder is set: prometheus-client reads it at import

        metrics.serve(metrics_port)
    _run_worker(settings, machine, chosen, bench, name, concurrency or settings.worker_concurrency, pool, loglevel,
                lane)


def _bench_lane(name: str, worker_id: str, targets, bench, pool: str, loglevel: str):
    """The benchmark lane of this worker: its own process and pool, tied to this process (``lifeline``)."""
    from enginefarm.server import lifeline
    from enginefarm.worker.lanes import BUILD_TARGETS_ENV, LANE_OF_ENV, LANE_POLL_S, BenchmarkLane

    args = [sys.executable, "-m", "enginefarm", "worker", "--lane", "benchmarks", "--name", name,
            "--targets", ",".join(str(t) for t in targets), "--bench-targets", ",".join(str(t) for t in bench),
            "--concurrency", "1", "--pool", pool, "--loglevel", loglevel]
    env = {**os.environ, LANE_OF_ENV: worker_id, BUILD_TARGETS_ENV: ",".join(str(t) for t in targets),
           # A benchmark that starts a little later costs nothing; a database broker polled less often, CPU.
           "ENGINEFARM_BROKER_POLL_SECONDS": str(max(get_settings().broker_poll_seconds, LANE_POLL_S))}
    return BenchmarkLane(lambda: lifeline.spawn(args, env=env))


def _run_worker(settings, machine, targets, bench, name, concurrency, pool, loglevel, lane="both") -> None:
    from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

    from enginefarm.server.embedded import prepare
    from enginefarm.workerid import WORKER_ID_ENV, new_worker_id
    from enginefarm.worker.drain import LANE_EXIT_S, Drain
    from enginefarm.worker.heartbeat import Heartbeat
    from enginefarm.worker.lanes import LANE_OF_ENV

    in_lane = lane == "benchmarks"
    if in_lane and not os.environ.get(LANE_OF_ENV):
        fail(RuntimeError(f"--lane benchmarks runs under a worker: {LANE_OF_ENV} names its worker id"))
    # New at every start: the tasks a crashed predecessor of the same name left running are requeued once its
    # id falls silent, instead of being kept "running" by this process's heartbeats. A benchmark lane serves
    # under the id of the worker that started it.
    worker_id = os.environ[LANE_OF_ENV] if in_lane else new_worker_id(name)
    os.environ[WORKER_ID_ENV] = worker_id  # pool children inherit it
    for attempt in range(5):  # several processes may migrate a fresh catalog at once
        try:
            prepare(settings)
            break
        except Exception:
            if attempt == 4:
                raise
            time.sleep(1 + attempt)
    from enginefarm.worker.tasks import app as celery_app

    from enginefarm.domain import QUANTIZE_QUEUE, Backend

    heartbeat = Heartbeat(settings, worker_id, [str(t) for t in targets], machine.to_dict(), [str(t) for t in bench],
                          row=not in_lane)
    build_queues = [t.queue for t in targets]
    if any(t.backend is Backend.ONNXRUNTIME for t in targets):  # ONNX Runtime CPU workers quantize
        build_queues.append(QUANTIZE_QUEUE)
    bench_queues = [t.bench_queue for t in bench]
    # A worker that builds and benchmarks serves its benchmark queues from a second pool (enginefarm.worker.lanes).
    split = lane == "both" and bool(build_queues) and bool(bench_queues)
    bench_lane = _bench_lane(name, worker_id, targets, bench, pool, loglevel) if split else None
    queues = bench_queues if in_lane else build_queues if split else build_queues + bench_queues
    # SIGTERM: running tasks get ENGINEFARM_SHUTDOWN_GRACE_SECONDS, then go back to the queue (worker/drain.py).
    drain = Drain(settings, worker_id, sweep=not in_lane).install()

    def ready(**_) -> None:
        heartbeat.start()

    def shutting_down(**_) -> None:  # at the start of a shutdown: the lane stops too, and is not started again
        drain.begin()
        if bench_lane is not None:
            bench_lane.stop(wait=False)

    def shutdown(**_) -> None:
        if bench_lane is not None:
            bench_lane.stop(timeout=drain.remaining() + LANE_EXIT_S)  # it drains within the same grace
        drain.finish()  # after the lane: nothing of this worker runs any more
        heartbeat.stop()

    worker_ready.connect(ready, weak=False)
    worker_shutting_down.connect(shutting_down, weak=False)
    worker_shutdown.connect(shutdown, weak=False)
    if not in_lane:
        err.print(f"worker {worker_id} builds: {', '.join(str(t) for t in targets) or 'nothing'}; "
                  f"benchmarks: {', '.join(str(t) for t in bench) or 'nothing'}"
                  + ("; benchmarks in a pool of their own" if split else ""))
    if bench_lane is not None:  # starts up while this one does
        bench_lane.start()
    celery_app.worker_main([
        "worker", "-Q", ",".join(queues), "--concurrency", str(concurrency), "--pool", pool,
        "--loglevel", loglevel, "-n", f"bench.{worker_id}" if in_lane else worker_id,
        # Event heartbeats stay on (Flower and `celery inspect` see live workers by them); gossip and mingle, which
        # keep every worker in step with every other at a cost that grows with the fleet, stay off: the farm's own
        # heartbeats (the catalog's workers table) are what it schedules and requeues by.
        "--without-gossip", "--without-mingle",
    ])


@app.command()
def reconcile(loop: bool = typer.Option(False, "--loop", help="run as the farm's background service: reconcile "
                                                                "every ENGINEFARM_RECONCILE_SECONDS and sweep blobs "
                                                                "every ENGINEFARM_GC_INTERVAL_SECONDS")) -> None:
    """Requeue tasks of workers that died and republish queued tasks whose broker message was lost. With --loop,
    the farm's background service: it works while it holds the farm's job lock, so any number of them (and of
    API processes, which run the same loop unless ENGINEFARM_RECONCILE_SECONDS=0) do the work once."""
    from enginefarm.server.embedded import stop_on_sigterm
    from enginefarm.storage.reconcile import Reconciler, reconcile_once

    settings = get_settings()
    if not loop:
        counts = reconcile_once(settings)
        console.print(f"requeued {counts['requeued']} task(s) of dead workers, republished {counts['republished']} "
                      f"lost message(s)")
        return
    if settings.reconcile_seconds <= 0:
        err.print("error: ENGINEFARM_RECONCILE_SECONDS is 0 here; give the service an interval, e.g. 15")
        raise typer.Exit(2)
    console.print(f"reconciling every {settings.reconcile_seconds:g} s and sweeping blobs every "
                  f"{settings.gc_interval_seconds:g} s while this process holds the farm's job lock; Ctrl-C stops",
                  highlight=False)
    service = Reconciler(settings)
    try:
        with stop_on_sigterm():
            service.run()
    except KeyboardInterrupt:
        pass


@app.command()
def gc(grace_hours: Optional[float] = typer.Option(None, help="keep unreferenced blobs younger than this "
                                                                 "(default ENGINEFARM_GC_GRACE_SECONDS, 24 h)"),
       dry_run: bool = typer.Option(False, "--dry-run", help="report what would go, delete nothing"),
       as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
       allow_empty_catalog: bool = typer.Option(False, help="sweep even though no row references any blob")) -> None:
    """Delete blobs that no catalog row references, once older than the grace period (the API's background
    sweep does the same every ENGINEFARM_GC_INTERVAL_SECONDS). A referenced blob is never deleted."""
    from enginefarm.storage.gc import collect_garbage

    settings = get_settings()
    grace = grace_hours * 3600 if grace_hours is not None else settings.gc_grace_seconds
    try:
        report = collect_garbage(settings, grace_seconds=grace, dry_run=dry_run, allow_empty_catalog=allow_empty_catalog)
    except Exception as exc:  # GcRefused, or the store or catalog unreachable
        fail(exc)
    if as_json:
        print(json.dumps(report.to_dict(), default=str))
    else:
        console.print(report.summary(), highlight=False)
    if report.errors:
        raise typer.Exit(1)


@app.command()
def migrate() -> None:
    """Create or upgrade the catalog's tables (the API also does this at start)."""
    from enginefarm.server.embedded import prepare

    prepare(get_settings())
    console.print("catalog is at the newest revision")


@app.command()
def up(port: int = typer.Option(8321, help="the API's port"),
       workers: int = typer.Option(1, help="worker processes"),
       data_dir: Optional[Path] = typer.Option(None, "--data-dir", envvar="ENGINEFARM_DATA_DIR",
                                               help="where the farm keeps its catalog and blobs (default "
                                                    "~/.enginefarm)")) -> None:
    """Run an all-in-one farm (API + workers) with no external services, until Ctrl-C. A worker or API process
    that dies is started again; when this command ends, however it ends, they end with it."""
    import logging

    from enginefarm.server.embedded import Farm, issue_token, stop_on_sigterm

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    if data_dir is not None:  # the API and the workers read it from the environment they inherit
        os.environ["ENGINEFARM_DATA_DIR"] = str(data_dir.resolve())
        get_settings.cache_clear()
    settings = get_settings()
    metrics_dir(settings.data_dir / "metrics")  # one folder: the API's /metrics counts the workers' builds too
    token = issue_token(settings, f"enginefarm up on {socket.gethostname()}", ["admin"])
    # Short enough that the workers and the API are stopped before a service manager's SIGKILL comes.
    farm = Farm({}, port=port, log_dir=settings.data_dir, token=token, stop_timeout=8)
    try:
        with stop_on_sigterm(), farm:
            farm.start_api()
            names = [f"embedded-{i}" for i in range(workers)]
            for n in names:
                farm.start_worker(n)
            farm.wait_workers(names, restart=True)  # a worker that dies this early is started again too
            console.print(f"enginefarm is up at {farm.url} (docs: {farm.url}/docs); data in {settings.data_dir}. "
                          f"Ctrl-C stops it. An admin API token was made for you; in another shell:", highlight=False)
            print(f"export ENGINEFARM_API_URL={farm.url}\nexport ENGINEFARM_TOKEN={token}", flush=True)
            while True:
                farm.supervise()
                time.sleep(1)
    except KeyboardInterrupt:
        pass


# ------------------------------------------------------------------------------ client commands


@app.command()
def demo(data_dir: Optional[Path] = typer.Option(None, help="where the demo farm keeps its data (default: a new temp dir)"),
         serve: bool = typer.Option(False, "--serve", help="after the demo, keep its farm running and print the "
                                                           "dashboard's address and a token to sign in with"),
         port: int = typer.Option(8321, help="with --serve: the API's port")) -> None:
    """Start an embedded farm, build a small model for 5 targets, print the catalog, fetch the sm86 engine; with
    --serve, then serve the dashboard (/ui) on that farm until Ctrl-C."""
    if serve:
        from enginefarm.server.demoserve import serve_demo

        sys.exit(serve_demo(data_dir, console, port))
    from enginefarm.server.demo import run_demo
    from enginefarm.server.embedded import stop_on_sigterm

    with stop_on_sigterm():
        code = run_demo(data_dir, console)
    sys.exit(code)


