"""A model's generation moves with every change to its engines and their benchmarks, and with nothing else.

It is what resolve answers are cached and tagged by: a missed bump would serve a stale answer, an extra one only
costs a recomputation. Run on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from enginefarm.core.config import Settings
from server import localservers
from storage import catalog, checks
from storage.db import migrate, session_scope
from storage.tables import ModelRow
from tests.helpers import catalog_engine, catalog_model, unique_name


@pytest.fixture(scope="module")
def own_pg(base_services):
    """A database of its own: these engines have no bytes, and the suite's farm must never list them."""
    with localservers.scratch_postgres("enginefarm_generation") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request, tmp_path) -> Settings:
    url = request.getfixturevalue("own_pg") if request.param == "postgresql" else None
    s = Settings(data_dir=tmp_path, **({"database_url": url} if url else {}))
    migrate(s)
    return s


def generations(settings: Settings, *ids: int) -> list[int]:
    with session_scope(settings) as s:
        by_id = dict(s.execute(select(ModelRow.id, ModelRow.generation).where(ModelRow.id.in_(ids))).all())
    return [by_id[i] for i in ids]


STATS = {"e2e": {"median": 1.5, "p99": 2.0}}


def test_every_engine_and_benchmark_change_bumps_each_model_row_of_those_bytes(settings):
    sha, other_sha = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    with session_scope(settings) as s:
        mine, twin, other = (
            catalog_model(s, unique_name(n), x).id for n, x in (("gen", sha), ("twin", sha), ("other", other_sha))
        )
    assert generations(settings, mine, twin, other) == [0, 0, 0]

    with session_scope(settings) as s:
        engine = catalog_engine(s, s.get(ModelRow, mine), "sm86")
    after_engine = generations(settings, mine, twin, other)
    assert after_engine[0] == after_engine[1] > 0 and after_engine[2] == 0  # the twin shares the bytes

    steps = [
        lambda s: checks.record_benchmark(
            s,
            engine,
            project="",
            shape_key="opt",
            shapes={},
            machine={},
            gpu_name="RTX",
            compute_capability="8.6",
            stats=STATS,
        ),
        # the same measurement again replaces the first (a bulk delete, then an insert)
        lambda s: checks.record_benchmark(
            s,
            engine,
            project="",
            shape_key="opt",
            shapes={},
            machine={},
            gpu_name="RTX",
            compute_capability="8.6",
            stats=STATS,
        ),
        lambda s: checks.record_verdict(s, engine, "", {"pass": True}),
        # a later verdict of the same project replaces the first
        lambda s: checks.record_verdict(s, engine, "", {"pass": False}),
    ]
    last = after_engine
    for step in steps:
        with session_scope(settings) as s:
            step(s)
        now = generations(settings, mine, twin, other)
        assert now[0] > last[0] and now[1] > last[1] and now[2] == 0, (now, last)
        last = now


def test_a_rolled_back_change_and_a_change_elsewhere_leave_it_alone(settings):
    sha = uuid.uuid4().hex * 2
    with session_scope(settings) as s:
        model = catalog_model(s, unique_name("gen"), sha).id
        engine = catalog_engine(s, s.get(ModelRow, model), "sm86")
    before = generations(settings, model)
    with pytest.raises(RuntimeError), session_scope(settings) as s:
        checks.record_verdict(s, engine, "", {"pass": False})
        s.flush()
        raise RuntimeError("the worker died before its commit")
    with session_scope(settings) as s:  # samples are not part of a resolve answer
        catalog.set_samples(s, s.get(ModelRow, model), sha256="d" * 64, key="samples/x", info={})
    assert generations(settings, model) == before
