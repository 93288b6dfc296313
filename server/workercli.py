"""``enginefarm worker``: probe this machine, choose the queues it serves, and run the Celery worker with its
heartbeat, its shutdown grace and, where it builds and benchmarks, its benchmark lane. Registered by
``server.cli``."""

from __future__ import annotations

import json
import os
import socket
import sys

import typer

from enginefarm.client.terminal import console, err, fail
from enginefarm.core.config import get_settings
from server.metricsdir import metrics_dir


def worker(
    probe: bool = typer.Option(False, "--probe", help="print what this machine can build, then exit"),
    targets: str | None = typer.Option(None, help="comma-separated targets to serve instead of the probed ones"),
    bench_targets: str | None = typer.Option(
        None,
        "--bench-targets",
        help="comma-separated targets whose engines to benchmark instead of the probed ones "
        "(engines this machine's GPU or CPU runs), or 'none'",
    ),
    name: str | None = typer.Option(None, help="worker name (default: the hostname)"),
    concurrency: int = typer.Option(None, help="parallel builds (default ENGINEFARM_WORKER_CONCURRENCY or 1)"),
    pool: str = typer.Option("prefork", help="Celery pool: prefork isolates builds in child processes"),
    loglevel: str = typer.Option("info", help="Celery's log level: debug, info, warning or error"),
    lane: str = typer.Option(
        "both",
        hidden=True,
        help="'benchmarks': run as the benchmark lane of the worker "
        "named by ENGINEFARM_LANE_OF (the worker starts it itself)",
    ),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", help="serve Prometheus metrics (build and benchmark seconds per target) on this port"
    ),
) -> None:
    """Probe this machine, then consume the build queues of exactly the targets it can build and the
    benchmark queues of exactly the targets whose engines it can run. Builds and benchmarks run in separate
    pools (a second Celery worker process for the benchmarks), so a build never waits behind a benchmark."""
    from enginefarm.core.probe.machineprobe import probe_machine
    from enginefarm.core.probe.policy import benchmark_targets, buildable_targets
    from enginefarm.core.probe.report import probe_report

    settings = get_settings()
    machine = probe_machine()
    if probe:
        console.print_json(json.dumps(machine.to_dict()))
        for line in probe_report(machine):
            console.print(line, highlight=False)
        return
    from enginefarm.core.domain import Target
    from enginefarm.core.workerid import check_worker_name

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
        from worker.process import metrics  # after the folder is set: prometheus-client reads it at import

        metrics.serve(metrics_port)
    _run_worker(
        settings, machine, chosen, bench, name, concurrency or settings.worker_concurrency, pool, loglevel, lane
    )


def _bench_lane(name: str, worker_id: str, targets, bench, pool: str, loglevel: str):
    """The benchmark lane of this worker: its own process and pool, tied to this process (``lifeline``)."""
    from server import lifeline
    from worker.process.lanes import BUILD_TARGETS_ENV, LANE_OF_ENV, LANE_POLL_S, BenchmarkLane

    args = [
        sys.executable,
        "-m",
        "enginefarm",
        "worker",
        "--lane",
        "benchmarks",
        "--name",
        name,
        "--targets",
        ",".join(str(t) for t in targets),
        "--bench-targets",
        ",".join(str(t) for t in bench),
        "--concurrency",
        "1",
        "--pool",
        pool,
        "--loglevel",
        loglevel,
    ]
    env = {
        **os.environ,
        LANE_OF_ENV: worker_id,
        BUILD_TARGETS_ENV: ",".join(str(t) for t in targets),
        # A benchmark that starts a little later costs nothing; a database broker polled less often, CPU.
        "ENGINEFARM_BROKER_POLL_SECONDS": str(max(get_settings().broker_poll_seconds, LANE_POLL_S)),
    }
    return BenchmarkLane(lambda: lifeline.spawn(args, env=env))


def _run_worker(settings, machine, targets, bench, name, concurrency, pool, loglevel, lane="both") -> None:
    from celery.signals import worker_ready, worker_shutdown, worker_shutting_down
    from tenacity import retry, stop_after_attempt, wait_incrementing

    from enginefarm.core.workerid import WORKER_ID_ENV, new_worker_id
    from server.embedded import prepare
    from worker.process.drain import LANE_EXIT_S, Drain
    from worker.process.heartbeat import Heartbeat
    from worker.process.lanes import LANE_OF_ENV

    in_lane = lane == "benchmarks"
    if in_lane and not os.environ.get(LANE_OF_ENV):
        fail(RuntimeError(f"--lane benchmarks runs under a worker: {LANE_OF_ENV} names its worker id"))
    # New at every start: the tasks a crashed predecessor of the same name left running are requeued once its
    # id falls silent, instead of being kept "running" by this process's heartbeats. A benchmark lane serves
    # under the id of the worker that started it.
    worker_id = os.environ[LANE_OF_ENV] if in_lane else new_worker_id(name)
    os.environ[WORKER_ID_ENV] = worker_id  # pool children inherit it
    # several processes may migrate a fresh catalog at once
    retry(stop=stop_after_attempt(5), wait=wait_incrementing(1, 1), reraise=True)(prepare)(settings)
    from enginefarm.core.directwrite import write_plans_direct
    from enginefarm.core.domain import build_queues as queues_for
    from worker.process.malloc import keep_freed_memory
    from worker.tasks import app as celery_app

    keep_freed_memory(settings.worker_malloc_keep_mib)  # before the pool forks: its processes inherit it
    write_plans_direct(settings.blob_store == "local")  # engines a local store fsyncs: around the page cache

    heartbeat = Heartbeat(
        settings, worker_id, [str(t) for t in targets], machine.to_dict(), [str(t) for t in bench], row=not in_lane
    )
    build_queues = queues_for(list(targets))
    bench_queues = [t.bench_queue for t in bench]
    # A worker that builds and benchmarks serves its benchmark queues from a second pool (worker.process.lanes).
    split = lane == "both" and bool(build_queues) and bool(bench_queues)
    bench_lane = _bench_lane(name, worker_id, targets, bench, pool, loglevel) if split else None
    queues = bench_queues if in_lane else build_queues if split else build_queues + bench_queues
    # SIGTERM: running tasks get ENGINEFARM_SHUTDOWN_GRACE_SECONDS, then go back to the queue (worker/process/drain.py).
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
        err.print(
            f"worker {worker_id} builds: {', '.join(str(t) for t in targets) or 'nothing'}; "
            f"benchmarks: {', '.join(str(t) for t in bench) or 'nothing'}"
            + ("; benchmarks in a pool of their own" if split else "")
        )
    if bench_lane is not None:  # starts up while this one does
        bench_lane.start()
    celery_app.worker_main(
        [
            "worker",
            "-Q",
            ",".join(queues),
            "--concurrency",
            str(concurrency),
            "--pool",
            pool,
            "--loglevel",
            loglevel,
            "-n",
            f"bench.{worker_id}" if in_lane else worker_id,
            # Event heartbeats stay on (Flower and `celery inspect` see live workers by them); gossip and mingle, which
            # keep every worker in step with every other at a cost that grows with the fleet, stay off: the farm's own
            # heartbeats (the catalog's workers table) are what it schedules and requeues by.
            "--without-gossip",
            "--without-mingle",
        ]
    )
