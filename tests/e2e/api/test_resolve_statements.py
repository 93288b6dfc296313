"""A computed /v1/resolve answer that explains costs two statements: the versions, then the engines with their
verdicts, their best latencies and every column the answer's engine shows (``storage.resolution.ENGINES_OF``); the
chosen engine needs none of its own. A second machine asking about the same model costs one (the
versions: the engines are kept). Without ``explain`` they are judged by kind (tests/e2e/api/test_resolve_by_kind.py).

The answer's engine must be what GET /v1/engines/{id} says of it (built from ORM rows), verdict metrics, the
version it is a variant of and all; and the latencies the one statement aggregates are the best per device. On
PostgreSQL and on the embedded farm's SQLite, whose SQL differs.
"""

from __future__ import annotations

import re
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from api.app import create_app
from enginefarm.core.config import Settings
from server.embedded import issue_token
from storage import checks
from storage.db import _quick_engine_for, session_scope
from tests.helpers import RTX_VERSION, catalog_engine, catalog_model, unique_name

GPU = "NVIDIA GeForce RTX 3090"
QUERY = {"cc": "8.6", "trt_rtx": RTX_VERSION, "gpu": GPU, "platform": "x86_64", "accept": "cpu"}
CATALOG = re.compile(r"\b(models|engines|benchmarks|engine_verdicts)\b")
METRICS = {"pass": True, "outputs": {"y": {"max_abs": 0.0012, "cosine": 0.99999}}}


@pytest.fixture
def farm(catalog_settings):
    settings = catalog_settings
    with TestClient(create_app(settings)) as http:
        http.headers["Authorization"] = f"Bearer {issue_token(settings, 'statements', ['read'])}"
        yield settings, http


def catalog_reads(settings: Settings) -> list[str]:
    """The statements on the catalog's tables that resolve's reads issue from now on (appended as they run)."""
    seen: list[str] = []
    engine = _quick_engine_for(settings.resolved_database_url)

    def record(conn, cursor, statement, *args):
        if CATALOG.search(statement):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    return seen


def test_a_computed_answer_reads_twice_and_its_engine_is_the_catalogs(farm):
    settings, http = farm
    name = unique_name("statements")
    with session_scope(settings) as s:
        source = catalog_model(s, name, uuid.uuid4().hex * 2)
        sm89, cpu = catalog_engine(s, source, "sm89"), catalog_engine(s, source, "cpu")
        derived = catalog_model(s, name, uuid.uuid4().hex * 2, version="1-int8")
        derived.source_model_id = source.id
        s.flush()
        sm86 = catalog_engine(s, derived, "sm86")
        for median, gpu in ((3.25, GPU), (2.5, GPU), (4.0, "NVIDIA RTX A6000")):
            checks.record_benchmark(
                s,
                sm86,
                project="",
                shape_key="opt",
                shapes={},
                machine={},
                gpu_name=gpu,
                compute_capability="8.6",
                stats={"e2e": {"median": median, "p99": median + 1}},
            )
        checks.record_verdict(s, sm86, "", METRICS)
        checks.record_verdict(s, cpu, "someone-else", {"pass": False})
    params = QUERY | {"model": name, "explain": True}
    reads = catalog_reads(settings)

    first = http.get("/v1/resolve", params=params)
    assert first.status_code == 200, first.text
    assert len(reads) == 2, reads  # the versions, then the engines with all the answer needs
    assert "models" in reads[0] and "engines" in reads[1] and "benchmarks" in reads[1]
    answer = first.json()
    catalogs = http.get(f"/v1/engines/{sm86}").json()
    assert answer["engine"] == catalogs | {"checks": None}
    assert answer["engine"]["variant_of"] == "1" and answer["engine"]["accuracy"] == METRICS
    assert answer["accuracy"] == "pass"
    by_id = {c["engine_id"]: c for c in answer["candidates"]}
    assert set(by_id) == {sm86, sm89, cpu}
    assert by_id[sm86]["latency_ms"] == 2.5  # the best of the two on this GPU model
    assert by_id[sm89]["latency_ms"] is None and by_id[cpu]["accuracy"] is None  # another project's verdict

    del reads[:]
    other = http.get("/v1/resolve", params=params | {"cc": "8.9", "gpu": "NVIDIA L4"})
    assert other.status_code == 200 and other.json()["engine"]["id"] == sm89
    assert len(reads) == 1 and "models" in reads[0], reads  # the engines were kept

    # The derived version alone: its source is not among the versions read, so its version is one more statement.
    del reads[:]
    alone = http.get("/v1/resolve", params=params | {"version": "1-int8"})
    assert alone.status_code == 200 and alone.json()["engine"] == answer["engine"]
    assert len(reads) == 3, reads


def test_latencies_measured_at_different_input_shapes_are_not_compared(farm):
    """Two builds of one model with different opt shapes are each benchmarked at their own: a smaller input's
    latency must not make a slower int8 artifact win over fp32 (the int8 one measured 0.79 ms at 2x3x32x96, the fp32
    one 1.28 ms at 4x3x48x192). Measured at the same shapes, the faster one wins."""
    from storage.tables import EngineRow

    settings, http = farm
    name = unique_name("shapes")
    with session_scope(settings) as s:
        model = catalog_model(s, name, uuid.uuid4().hex * 2)
        ids = []
        for precision, spec in (("fp32", "1"), ("int8", "2")):  # one build key each
            row = s.get(EngineRow, catalog_engine(s, model, "cpu"))
            row.precision, row.spec_hash = precision, spec * 64
            s.flush()
            checks.record_verdict(s, row.id, "", {"pass": True})
            ids.append(row.id)
        fp32, int8 = ids

        def measure(engine_id: int, dims: list[int], median: float) -> None:
            checks.record_benchmark(
                s,
                engine_id,
                project="",
                shape_key="opt",
                shapes={"x": dims},
                machine={},
                gpu_name=None,
                compute_capability=None,
                cpu_name="AMD EPYC 7B13",
                stats={"e2e": {"median": median, "p99": median + 1}},
            )

        measure(int8, [2, 3, 32, 96], 0.79)
        measure(fp32, [4, 3, 48, 192], 1.28)
    params = {"model": name, "platform": "x86_64", "cpu": "AMD EPYC 7B13", "explain": True}
    answer = http.get("/v1/resolve", params=params).json()
    assert answer["engine"]["id"] == fp32, answer["ranked_by"]
    assert "measured only at other input shapes" in answer["ranked_by"]
    rows = http.get(f"/v1/models/{model.id}/report").json()["rows"]
    assert {r["engine_id"]: r["best"] for r in rows} == {fp32: True, int8: False}  # the report's star alike

    with session_scope(settings) as s:  # the int8 artifact measured again, at fp32's shapes: now they compare
        measure(int8, [4, 3, 48, 192], 0.91)
    answer = http.get("/v1/resolve", params=params).json()
    assert answer["engine"]["id"] == int8, answer["ranked_by"]
    assert "fastest measured on the CPU AMD EPYC 7B13" in answer["ranked_by"]
    rows = http.get(f"/v1/models/{model.id}/report").json()["rows"]
    assert {r["engine_id"]: r["best"] for r in rows if r["shapes"] == {"x": [4, 3, 48, 192]}} == {
        fp32: False,
        int8: True,
    }


def test_shapes_that_name_no_input_of_the_model_get_a_422_not_a_404(farm):
    """`fetch --shapes y:4x3x48x192` (no input y) or `x:4x3x48` (rank 3) answered "none of the engines runs" and
    suggested a build that then failed with 422: both are the request's mistake, said at once."""
    from storage.tables import EngineRow

    settings, http = farm
    name = unique_name("inputs")
    rng = {"min": [1, 3, 48, 192], "opt": [4, 3, 48, 192], "max": [8, 3, 48, 192]}
    with session_scope(settings) as s:
        model = catalog_model(s, name, uuid.uuid4().hex * 2)
        s.get(EngineRow, catalog_engine(s, model, "sm86")).profiles = [{"x": rng}]
    base = {"model": name, "cc": "8.6", "trt_rtx": RTX_VERSION, "platform": "x86_64"}
    for shapes, words in (("y:4x3x48x192", "the model has no input 'y'"), ("x:4x3x48", "has rank 4, you gave 3")):
        refused = http.get("/v1/resolve", params=base | {"shapes": shapes})
        assert refused.status_code == 422, refused.text
        assert words in refused.text and "x (rank 4)" in refused.text, refused.text
    outside = http.get("/v1/resolve", params=base | {"shapes": "x:64x3x48x192"})
    assert outside.status_code == 404 and "covers 1x3x48x192..8x3x48x192" in outside.text, outside.text
