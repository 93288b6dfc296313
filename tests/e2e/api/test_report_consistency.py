"""A model's report never calls a check finished while its figures are missing.

A check's measurements, verdict and end are committed together by the worker, but the report reads them in several
statements, and each statement sees what was committed when it ran. Here the worker's commit lands between the
report's read of the engines (with their measurements) and the rest, as it can on a busy machine: the report must
then still count the check as in progress (so ``Client.wait_checks`` waits on), not finished with nothing measured
(which stopped ``enginefarm demo`` before its figures on a slow machine).
"""

from __future__ import annotations

import uuid

import pytest

from api.services import reports
from enginefarm.core.config import Settings
from enginefarm.core.domain import TaskState
from enginefarm.core.spec import BuildSpec
from server import localservers
from server.embedded import prepare
from storage import builtengines, checks
from storage.db import session_scope
from storage.tables import BenchmarkTaskRow, EngineRow
from tests.helpers import catalog_engine, catalog_model, unique_name

STATS = {"e2e": {"median": 1.0, "p99": 2.0}, "throughput_qps": 1000.0}


def _finish(settings: Settings, engine_id: int, task_id: int) -> None:
    """What the worker commits at the end of a check: its figures, its verdict and its end, in one transaction."""
    with session_scope(settings) as s:
        checks.record_benchmark(
            s,
            engine_id,
            project="",
            shape_key="opt",
            shapes={},
            machine={},
            gpu_name=None,
            compute_capability=None,
            stats=STATS,
            cpu_name="test cpu",
        )
        checks.record_verdict(s, engine_id, "", {"pass": True}, task_id=task_id)
        checks.end_benchmark(s, task_id, TaskState.SUCCEEDED)


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request, tmp_path, base_services):
    if request.param == "sqlite":
        yield Settings(data_dir=tmp_path, reconcile_seconds=0, gc_interval_seconds=0)
        return
    with localservers.scratch_postgres("enginefarm_reportreads") as url:
        yield Settings(data_dir=tmp_path, database_url=url, reconcile_seconds=0, gc_interval_seconds=0)


def test_a_check_that_ends_while_the_report_is_read_is_still_in_progress(settings, monkeypatch):
    prepare(settings)
    with session_scope(settings) as s:
        model = catalog_model(s, unique_name("torn"), uuid.uuid4().hex * 2)
        engine_id = catalog_engine(s, model, "cpu")
        task = checks.ensure_benchmark_task(s, s.get(EngineRow, engine_id), BuildSpec(), "")
        assert task is not None
        s.flush()
        task.state, task.worker_id = TaskState.RUNNING.value, "w1"
        model_id, task_id = model.id, task.id

    read_engines = builtengines.engines_of_models

    def then_the_worker_commits(session, models):
        engines = read_engines(session, models)
        _finish(settings, engine_id, task_id)  # between the engines' read and the reads after it
        return engines

    monkeypatch.setattr(builtengines, "engines_of_models", then_the_worker_commits)
    with session_scope(settings) as s:
        report = reports.model_report(s, settings, model_id)
    [row] = report["rows"]
    finished_without_figures = row["status"] != "measured" and not report["checks_in_progress"]
    assert not finished_without_figures, (row["status"], row["check"], report["checks_in_progress"])
    assert report["checks_in_progress"] == [engine_id]

    monkeypatch.setattr(builtengines, "engines_of_models", read_engines)
    with session_scope(settings) as s:  # the next poll: finished, with its figures
        report = reports.model_report(s, settings, model_id)
    assert report["checks_in_progress"] == [] and report["rows"][0]["status"] == "measured"
    with session_scope(settings) as s:
        assert s.get(BenchmarkTaskRow, task_id).state == TaskState.SUCCEEDED.value
