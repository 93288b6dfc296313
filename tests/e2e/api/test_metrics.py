"""GET /metrics after a real build, parsed as Prometheus parses it; /healthz is liveness and /readyz readiness.

The session farm's API and workers share one prometheus-client multiprocess folder (as `enginefarm up` sets it),
so the API's scrape counts the workers' builds too.
"""

from __future__ import annotations

import time

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from enginefarm.client import Client
from enginefarm.core.config import Settings
from enginefarm.core.machine import Machine
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.helpers import unique_name


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """Every sample by name, keyed by its sorted labels."""
    r = httpx.get(f"{url}/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text[:300]
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def total(samples: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for k, v in samples.get(name, {}).items() if want <= set(k))


def test_metrics_after_a_build(farm, tmp_path):
    before = scrape(farm.url)
    path = save_conv_net(tmp_path / "m.onnx", seed=4101)
    target = "onnxruntime/cpu-x86_64"
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("metrics"))
        build = c.build(model["id"], [target], sample_spec())
        done = c.wait_build(build["id"], timeout=300, poll=0.2)
        assert [t["state"] for t in done["tasks"]] == ["succeeded"], done
        machine = Machine(platform="x86_64")
        c.resolve(model["name"], machine)
        c.resolve(model["name"], machine)  # from the cache: the same outcome, counted again
    deadline = time.monotonic() + 30
    while True:  # the worker's histogram is written after the engine is catalogued
        after = scrape(farm.url)
        built = total(after, "enginefarm_build_seconds_count", target=target)
        if built > total(before, "enginefarm_build_seconds_count", target=target) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert built >= 1, "the worker's build was not counted"
    assert total(after, "enginefarm_build_seconds_sum", target=target) > 0
    grew = path.stat().st_size
    assert total(after, "enginefarm_upload_bytes_total") - total(before, "enginefarm_upload_bytes_total") >= grew
    assert (
        total(after, "enginefarm_resolve_total", outcome="cpu_fallback")
        - total(before, "enginefarm_resolve_total", outcome="cpu_fallback")
        == 2
    )
    # Latency by route template, not by path: one series for every model id.
    assert total(after, "enginefarm_http_request_duration_seconds_count", route="/v1/resolve", method="POST") >= 2
    assert total(after, "enginefarm_http_request_duration_seconds_count", route="/v1/builds/{build_id}") >= 1
    assert not any(
        f"/v1/builds/{build['id']}" == dict(k).get("route")
        for k in after["enginefarm_http_request_duration_seconds_count"]
    )
    # The catalog's view: tasks by state, live workers per target, queue depth per target (none queued here).
    assert total(after, "enginefarm_tasks", kind="build", state="succeeded") >= 1
    assert total(after, "enginefarm_workers_live", role="build", target=target) >= 1
    assert total(after, "enginefarm_workers_live", role="build", target="tensorrt-rtx/sm86") >= 1


def test_a_task_waiting_for_a_worker_shows_in_queue_depth_and_age(farm, api, conv_model):
    model = api.post(
        "/v1/models", data={"name": unique_name("metrics")}, files={"file": ("m.onnx", conv_model.read_bytes())}
    ).json()
    lonely = "tensorrt-rtx/sm75"  # no worker of the session farm builds it
    r = api.post(
        "/v1/builds",
        json={"model_id": model["id"], "targets": [lonely], "spec": sample_spec(), "queue_without_worker": True},
    )
    assert r.status_code == 202, r.text
    time.sleep(1.1)
    after = scrape(farm.url)
    assert total(after, "enginefarm_queue_depth", kind="build", target=lonely) >= 1
    assert total(after, "enginefarm_queue_oldest_age_seconds", kind="build", target=lonely) >= 1.0


def test_liveness_and_readiness(farm, tmp_path):
    assert httpx.get(f"{farm.url}/healthz").json()["status"] == "ok"
    ready = httpx.get(f"{farm.url}/readyz", timeout=30)
    assert ready.status_code == 200, ready.text
    assert set(ready.json()["checks"]) == {"catalog", "broker", "blob_store"}
    # A farm whose database is gone: alive, not ready, and it says which dependency and when to ask again.
    gone = Settings(
        data_dir=tmp_path,
        database_url="postgresql+psycopg://postgres@127.0.0.1:1/none",
        reconcile_seconds=0,
        gc_interval_seconds=0,
    )
    http = TestClient(create_app(gone))  # no `with`: its start-up would migrate the database that is not there
    assert http.get("/healthz").status_code == 200
    r = http.get("/readyz")
    assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
    checks = r.json()["checks"]
    assert checks["catalog"]["ok"] is False and checks["catalog"]["detail"] == "OperationalError"
    assert checks["blob_store"]["ok"] is True and checks["broker"]["ok"] is True
    assert "127.0.0.1:1" not in r.text
