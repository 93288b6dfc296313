"""SIGTERM to a worker with a build running, as Kubernetes sends it (to the container's first process only, then
SIGKILL after the pod's grace period): the build finishes within ENGINEFARM_SHUTDOWN_GRACE_SECONDS, or goes back to
the queue at once for another worker. No task is lost or left running, and there is one engine."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from datetime import datetime, timezone

import redis
from sqlalchemy import select

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec, save_conv_net
from storage.db import as_utc, session_scope
from storage.tables import BenchmarkTaskRow, BuildTaskRow, WorkerRow
from tests.e2e.test_faults import NO_CHECKS, PORTABLE, wait_task
from tests.faults import audit, slow
from tests.helpers import unique_name

QUEUE = "build.tensorrt-rtx.portable"


# A pod's terminationGracePeriodSeconds beyond the worker's grace, as the default (20 s) leaves under Kubernetes' 30 s:
# the time to put the tasks back and exit (Celery's pool shutdown alone takes seconds on a busy machine).
EXIT_S = 10.0


def grace(seconds: float) -> dict[str, str]:
    return {"ENGINEFARM_SHUTDOWN_GRACE_SECONDS": str(seconds)}


def stopped_within(proc: subprocess.Popen, seconds: float) -> tuple[int, float]:
    """Wait for ``proc`` as a pod's kubelet does: SIGKILL to its whole group if it is still there after
    ``seconds``. Returns (exit code, seconds it took)."""
    started = time.monotonic()
    try:
        code = proc.wait(seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait(10)
    return code, time.monotonic() - started


def running_under(settings, worker_id: str) -> list[int]:
    with session_scope(settings) as s:
        return list(
            s.scalars(
                select(BuildTaskRow.id).where(BuildTaskRow.state == "running", BuildTaskRow.worker_id == worker_id)
            )
        )


def test_sigterm_lets_the_running_build_finish_and_more_signals_change_nothing(farm, tmp_path, dist_settings):
    """Grace 20 s, a build with 5 s to go: it finishes and the worker exits 0 right after. The heartbeat goes on
    meanwhile (the reconciler must not requeue a build about to finish), and the signals that follow (two SIGINTs,
    which Celery takes for a cold shutdown that cancels the build, and a SIGTERM) are ignored."""
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=301), unique_name("drain"))
        worker = farm.start_worker("drain-a", [PORTABLE], bench_targets=[], extra_env={**slow(6), **grace(20)})
        try:
            build = c.build(model["id"], [PORTABLE], {**sample_spec(), **NO_CHECKS}, queue_without_worker=True)
            running = wait_task(
                c,
                build["id"],
                lambda t: t["state"] == "running" and t["worker_id"].startswith("drain-a@"),
                what="running on drain-a",
            )
            time.sleep(1)  # inside the build's pause
            os.kill(worker.pid, signal.SIGTERM)
            time.sleep(1)
            for sig in (signal.SIGINT, signal.SIGINT, signal.SIGTERM):
                os.kill(worker.pid, sig)
                time.sleep(0.3)
            time.sleep(1.5)
            with session_scope(dist_settings) as s:  # still beating while it drains (every second here)
                row = s.get(WorkerRow, running["worker_id"])
                assert row is not None, "the worker's row went away while its build ran"
                silent = (datetime.now(timezone.utc) - as_utc(row.last_seen)).total_seconds()
            assert silent < 2.5, f"no heartbeat for {silent:.1f} s while draining"
            code, took = stopped_within(worker, 20 + EXIT_S)
        finally:
            farm.stop_process(farm.workers.pop("drain-a"))
        assert code == 0, f"exit code {code} after {took:.1f} s"
        task = c.wait_build(build["id"], timeout=30, poll=0.3)["tasks"][0]
        assert task["state"] == "succeeded" and task["worker_id"] == running["worker_id"], task
        assert task["attempts"] == 1 and task["error"] is None, task
        assert c.engines(model=model["name"], target=PORTABLE)["total"] == 1
        assert running["worker_id"] not in {w["id"] for w in c.workers()}
    log = (farm.log_dir / "worker-drain-a.log").read_text(errors="replace")
    assert "1 running task(s) get 20 s to finish" in log and "SIGINT ignored, already stopping" in log
    print(f"build finished under SIGTERM: the worker exited 0 in {took:.1f} s more")
    audit(dist_settings)


def test_sigterm_past_the_grace_puts_the_build_back_for_another_worker(farm, tmp_path, dist_settings, redis_url):
    """Grace 3 s, a build that needs 30 s: the worker exits 0 before a pod's SIGKILL (EXIT_S later). The task is
    already back in the queue then (not after a TTL or a visibility timeout), with this attempt not counted; another
    worker takes it and builds it. One engine; no task left running; no stray message in the broker."""
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=302), unique_name("drain"))
        victim = farm.start_worker("drain-b", [PORTABLE], bench_targets=[], extra_env={**slow(30), **grace(3)})
        try:
            build = c.build(model["id"], [PORTABLE], {**sample_spec(), **NO_CHECKS}, queue_without_worker=True)
            running = wait_task(
                c,
                build["id"],
                lambda t: t["state"] == "running" and t["worker_id"].startswith("drain-b@"),
                what="running on drain-b",
            )
            farm.start_worker("drain-rescuer", [PORTABLE], bench_targets=[], extra_env=slow(1))
            farm.wait_workers(["drain-rescuer"])
            sigterm_at = datetime.now(timezone.utc)
            os.kill(victim.pid, signal.SIGTERM)
            code, took = stopped_within(victim, 3 + EXIT_S)
            farm.workers.pop("drain-b")
            at_exit = c.get(f"/v1/builds/{build['id']}")["tasks"][0]
            assert code == 0, f"exit code {code} after {took:.1f} s"
            assert not running_under(dist_settings, running["worker_id"]), "a task left running under a stopped worker"
            assert at_exit["worker_id"] != running["worker_id"], at_exit
            taken = wait_task(
                c,
                build["id"],
                lambda t: t["state"] != "queued",
                timeout=5,
                what="taken by the rescuer within 5 s of the exit",
            )
            taken_after = (datetime.fromisoformat(taken["started_at"]) - sigterm_at).total_seconds()
            assert taken["worker_id"].startswith("drain-rescuer@"), taken
            done = c.wait_build(build["id"], timeout=120, poll=0.3)
            # The row is done before the Celery task returns. Stopped in between, the rescuer's pool process dies
            # of the SIGTERM sent to its group, and Celery puts the message back (it is skipped where it lands):
            # wait for the task's return, so that a stray message below is the drain's own.
            rescuer_log = farm.log_dir / "worker-drain-rescuer.log"
            deadline = time.monotonic() + 60
            returned = re.compile(r"Task enginefarm\.build_engine\[[^\]]+\] succeeded in")
            while not returned.search(rescuer_log.read_text(errors="replace")):
                assert time.monotonic() < deadline, "the rescuer's Celery task never returned"
                time.sleep(0.3)
        finally:
            farm.stop_process(farm.workers.pop("drain-rescuer"))
            farm.workers.pop("drain-b", None)
        task = done["tasks"][0]
        assert task["state"] == "succeeded" and task["worker_id"] == taken["worker_id"], task
        assert task["attempts"] == 1 and not task["reused"], task  # the stopped worker's attempt does not count
        assert c.engines(model=model["name"], target=PORTABLE)["total"] == 1
    # The worker put back one message. A second is the reconciler's only where it took the first for lost (the
    # rescuer, slow under load, had it but had not yet claimed the task after REPUBLISH_AFTER s): any worker then
    # skips it, and here none serves the queue any more, so it goes.
    broker = redis.Redis.from_url(redis_url)
    if broker.llen(QUEUE):
        api_log = (farm.log_dir / "api.log").read_text(errors="replace")
        assert f"; build {task['id']} to {QUEUE}" in api_log, "a second message for the task was left in the queue"
        broker.delete(QUEUE)
    log = (farm.log_dir / "worker-drain-b.log").read_text(errors="replace")
    assert f"put 1 running task(s) back in the queue: build {task['id']}" in log
    print(
        f"build put back: the worker exited 0 {took:.1f} s after SIGTERM; another worker claimed the "
        f"task {taken_after:.1f} s after SIGTERM"
    )
    audit(dist_settings)


def test_sigterm_puts_back_a_benchmark_of_the_lane_too(farm, tmp_path, dist_settings):
    """A worker that builds and benchmarks (its benchmark lane, a second process under the same worker id): a
    benchmark claimed by the lane waits for the build the worker runs. SIGTERM with a grace of 1 s: the worker stops
    its lane and both exit 0 in time; the build and the benchmark are back in the queue, neither attempt counted,
    and another worker finishes both."""

    def bench_row(engine_id: int) -> BenchmarkTaskRow | None:
        with session_scope(dist_settings) as s:
            return s.scalars(select(BenchmarkTaskRow).where(BenchmarkTaskRow.engine_id == engine_id)).first()

    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=303), unique_name("drain"))
        spec = {**sample_spec(), "accuracy": {"enabled": False}}
        worker = farm.start_worker("drain-c", [PORTABLE], bench_targets=[PORTABLE], extra_env={**slow(8), **grace(1)})
        try:
            first = c.build(model["id"], [PORTABLE], spec, queue_without_worker=True)
            second = c.build(model["id"], [PORTABLE], {**spec, "workspace_mib": 65}, queue_without_worker=True)
            engine_id = c.wait_build(first["id"], timeout=120, poll=0.3)["tasks"][0]["engine_id"]
            wait_task(c, second["id"], lambda t: t["state"] == "running", what="the second build running")
            deadline = time.monotonic() + 30  # the lane claims the first engine's benchmark and gives way
            while (row := bench_row(engine_id)) is None or row.state != "running":
                assert time.monotonic() < deadline, f"the lane never took the benchmark: {row and row.state}"
                time.sleep(0.2)
            worker_id = row.worker_id
            os.kill(worker.pid, signal.SIGTERM)
            code, took = stopped_within(worker, 1 + EXIT_S)
            farm.workers.pop("drain-c")
            assert code == 0, f"exit code {code} after {took:.1f} s"
            bench, build = bench_row(engine_id), c.get(f"/v1/builds/{second['id']}")["tasks"][0]
            assert (bench.state, bench.worker_id, bench.attempts) == ("queued", None, 0), (bench.state, bench.error)
            assert (build["state"], build["worker_id"], build["attempts"]) == ("queued", None, 0), build
            assert "shutdown grace of 1 s ran out" in bench.error and "shutdown grace" in build["error"]
            assert not running_under(dist_settings, worker_id)
            farm.start_worker("drain-c2", [PORTABLE], bench_targets=[PORTABLE])
            task = c.wait_build(second["id"], timeout=120, poll=0.3)["tasks"][0]
            deadline = time.monotonic() + 60  # both benchmarks (the second engine's too) end before the rescuer stops
            while (row := bench_row(engine_id)).state in ("queued", "running") or bench_row(
                task["engine_id"]
            ).state in ("queued", "running"):
                assert time.monotonic() < deadline, f"the benchmark never ran again: {row.state}"
                time.sleep(0.3)
        finally:
            farm.stop_process(farm.workers.pop("drain-c2", None) or worker)
            farm.workers.pop("drain-c", None)
        assert task["state"] == "succeeded" and task["attempts"] == 1, task
        assert task["worker_id"].startswith("drain-c2@"), task
        assert row.attempts == 1 and row.worker_id.startswith("drain-c2@"), (row.state, row.worker_id, row.attempts)
    print(f"build and lane benchmark put back: the worker exited 0 {took:.1f} s after SIGTERM (grace 1 s)")
    audit(dist_settings)
