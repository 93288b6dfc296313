"""A cold /v1/resolve answer judges the model's engines kind by kind (``api.services.resolve.by_kind``): a kind of
engine
that cannot run on the asking machine, or that a filter refuses, is counted under its rule without its engines being
read, and only the engines of the other kinds are read and judged. It must answer exactly as judging every engine
does: the same choice, fallbacks, ranking words and counts of what each rule excluded, for every kind of machine and
every filter. In process (TestClient) against PostgreSQL.
"""

from __future__ import annotations

import itertools
import uuid
from contextlib import ExitStack

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.services import resolve as resolver
from enginefarm.core.config import Settings
from server import localservers
from server.embedded import issue_token
from storage import checks, resolution
from storage.db import session_scope
from storage.tables import EngineRow
from tests.helpers import RTX_VERSION, catalog_model, unique_name

PROFILE = {"images": {"min": [1, 3, 640, 640], "opt": [1, 3, 640, 640], "max": [1, 3, 640, 640]}}
BATCH8 = {"images": {"min": [1, 3, 640, 640], "opt": [4, 3, 640, 640], "max": [8, 3, 640, 640]}}
RTX = {"trt_rtx": RTX_VERSION, "platform": "x86_64"}
MACHINES = {
    "RTX 3090": {"cc": "8.6", "gpu": "NVIDIA GeForce RTX 3090", **RTX},
    "L4": {"cc": "8.9", "gpu": "NVIDIA L4", **RTX},
    "RTX 5090": {"cc": "12.0", "gpu": "NVIDIA GeForce RTX 5090", **RTX},
    "T4": {"cc": "7.5", "gpu": "Tesla T4", **RTX},  # no engine of its own: the CPU artifact, asked for
    "CPU server": {"platform": "x86_64"},
    "Graviton": {"platform": "aarch64"},
}
FILTERS = [
    {},
    {"accept": "cpu"},
    {"precision": "int8"},
    {"precision": "fp32"},
    {"precisions": "fp16,fp32"},
    {"backend": "onnxruntime", "accept": "cpu"},
    {"accept": "unchecked"},
    {"shapes": "images:4x3x640x640"},
    {"memory_mib": "2000"},
]


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def catalog(request, base_services, tmp_path_factory):
    """One model: TensorRT-RTX engines for four compute capabilities and CPU artifacts for two platforms, each in
    fp16, fp32 and int8 (three specs); int8 checked on some GPUs (passed and failed), latencies on some, a batch-8
    profile on one spec, a large activation memory on one engine. On PostgreSQL and on SQLite (the embedded
    farm's), whose statements differ."""
    data = tmp_path_factory.mktemp("bykind")
    with ExitStack() as stack:
        if request.param == "postgresql":
            url = stack.enter_context(localservers.scratch_postgres("enginefarm_bykind"))
        else:
            url = f"sqlite:///{data / 'catalog.db'}"
        settings = Settings(data_dir=data, database_url=url, reconcile_seconds=0, gc_interval_seconds=0)
        token = issue_token(settings, "bykind", ["read"])
        name = unique_name("kinds")
        ids: dict[tuple[str, str], int] = {}
        with session_scope(settings) as s:
            model = catalog_model(s, name, uuid.uuid4().hex * 2)
            for (i, precision), arch in itertools.product(
                enumerate(("fp16", "fp32", "int8")), ("sm80", "sm86", "sm89", "sm120", "cpu", "cpu-aarch64")
            ):
                ids[arch, precision] = _engine(s, model, arch, precision, str(i) * 64)
            s.get(EngineRow, ids["sm89", "fp16"]).device_memory_bytes = 4 << 30
            checks.record_verdict(s, ids["sm86", "int8"], "", {"pass": True})
            checks.record_verdict(s, ids["sm89", "int8"], "", {"pass": False})
            for arch, precision, median in (("sm86", "fp16", 2.0), ("sm86", "int8", 1.2), ("sm89", "fp32", 3.0)):
                checks.record_benchmark(
                    s,
                    ids[arch, precision],
                    project="",
                    shape_key="opt",
                    shapes={},
                    machine={},
                    gpu_name=MACHINES["RTX 3090" if arch == "sm86" else "L4"]["gpu"],
                    compute_capability=f"{arch[2]}.{arch[3]}",
                    stats={"e2e": {"median": median, "p99": median + 1}},
                )
        yield settings, token, name, ids


def _engine(s, model, arch: str, precision: str, spec: str) -> int:
    cpu = arch.startswith("cpu")
    cc = None if cpu else f"{arch[2:-1]}.{arch[-1]}"
    platform = "aarch64" if arch == "cpu-aarch64" else "x86_64"
    row = EngineRow(
        model_id=model.id,
        model_sha256=model.sha256,
        spec_hash=spec,
        target=f"onnxruntime/cpu-{platform}" if cpu else f"tensorrt-rtx/{arch}",
        backend="onnxruntime" if cpu else "tensorrt-rtx",
        backend_version="1.23.2" if cpu else RTX_VERSION,
        precision=precision,
        compute_capability=cc,
        compute_capabilities=[cc] if cc else [],
        platform=platform,
        trt_version=None if cpu else RTX_VERSION,
        sha256=uuid.uuid4().hex * 2,
        size=1,
        blob_key=f"engines/{uuid.uuid4().hex}",
        build_seconds=0.1,
        profiles=[BATCH8 if precision == "fp32" else PROFILE],
    )
    s.add(row)
    s.flush()
    return row.id


def _answers(settings, token, name) -> list[tuple[str, int, bytes]]:
    with TestClient(create_app(settings)) as http:
        http.headers["Authorization"] = f"Bearer {token}"
        out = []
        for (kind, machine), wanted in itertools.product(MACHINES.items(), FILTERS):
            r = http.get("/v1/resolve", params={"model": name, **machine, **wanted})
            out.append((f"{kind} {wanted}", r.status_code, r.content))
        return out


def test_judging_by_kind_answers_as_judging_every_engine(catalog, monkeypatch):
    settings, token, name, ids = catalog
    applied = []
    real = resolver.by_kind
    monkeypatch.setattr(resolver, "by_kind", lambda *a: applied.append(out := real(*a)) or out)
    by_kind = _answers(settings, token, name)
    monkeypatch.setattr(resolver, "by_kind", lambda *a: None)
    every = _answers(settings, token, name)
    assert sum(a is not None for a in applied) >= len(by_kind) // 2, "judged by kind for most questions"
    assert {status for _q, status, _b in every} == {200, 404}
    for (question, status, body), (_q, status_every, body_every) in zip(by_kind, every):
        assert (status, body) == (status_every, body_every), question


def test_only_the_engines_of_kinds_that_may_run_are_read(catalog, monkeypatch):
    settings, token, name, ids = catalog
    read = []
    real = resolution.engine_table
    monkeypatch.setattr(resolution, "engine_table", lambda s, o, i=None: read.append(i) or real(s, o, i))
    with TestClient(create_app(settings)) as http:
        http.headers["Authorization"] = f"Bearer {token}"
        r = http.get("/v1/resolve", params={"model": name, **MACHINES["RTX 3090"], "accept": "cpu"})
    assert r.status_code == 200, r.text
    answer = r.json()
    # Of 18 engines: the three of the 3090's compute capability and the three x86_64 CPU artifacts are read.
    runs = {ids[arch, p] for arch in ("sm86", "cpu") for p in ("fp16", "fp32", "int8")}
    assert read == [tuple(sorted(runs))]
    assert answer["engine"]["id"] == ids["sm86", "int8"]  # passed its check, and the fastest measured here
    assert sum(answer["excluded"].values()) == 18 - 1 - len(answer["fallbacks"])
    # sm80, sm89 and sm120 in three precisions, the aarch64 artifacts, the CPU's unchecked int8 artifact
    assert answer["excluded"] == {"accuracy-gate": 1, "platform": 3, "rtx-cc": 9}
