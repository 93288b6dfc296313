"""The farm end to end on real services: PostgreSQL, Redis, SeaweedFS, uvicorn and two Celery workers."""

from __future__ import annotations

import hashlib
import time

from enginefarm.client import Client
from enginefarm.core.machine import Machine
from enginefarm.graph.samples import sample_spec, save_conv_net
from storage import builtengines
from storage.blobs import get_blob_store
from storage.db import session_scope
from tests.faults import bucket_keys, orphans
from tests.helpers import WORKER_A, WORKER_B, run_cli, unique_name

ALL_TARGETS = WORKER_A + WORKER_B


def _upload_and_build(farm, tmp_path, targets, seed):
    model_path = save_conv_net(tmp_path / "m.onnx", seed=seed)
    with Client(farm.url) as c:
        model, created = c.upload(model_path, unique_name("e2e"))
        assert created
        build = c.build(model["id"], targets, sample_spec())
        done = c.wait_build(build["id"], timeout=300, poll=0.2)
    return model_path, model, done


def test_upload_build_resolve_download(farm, dist_settings, tmp_path):
    model_path, model, build = _upload_and_build(farm, tmp_path, ALL_TARGETS, seed=1)
    states = {t["target"]: (t["state"], t["error"]) for t in build["tasks"]}
    assert all(s == "succeeded" for s, _ in states.values()), states
    assert model["sha256"] == hashlib.sha256(model_path.read_bytes()).hexdigest()

    # Each task ran on a worker that serves its target: the queues route by target.
    for task in build["tasks"]:
        expected = "worker-a" if task["target"] in WORKER_A else "worker-b"
        assert task["worker_id"].startswith(expected), task
        assert task["wait_seconds"] is not None and task["wait_seconds"] >= 0

    with Client(farm.url) as c:
        engines = c.engines(model=model["name"], limit=50)
        assert engines["total"] == len(ALL_TARGETS)
        by_target = {e["target"]: e for e in engines["items"]}
        assert by_target["tensorrt-rtx/sm86"]["compute_capability"] == "8.6"
        assert by_target["tensorrt-rtx/sm86"]["trt_version"].count(".") == 3  # full 4-part version
        assert by_target["onnxruntime/cpu-x86_64"]["compute_capability"] is None
        assert len({e["sha256"] for e in engines["items"]}) == len(ALL_TARGETS)

        # Every engine's bytes are in S3 under its content address, with the catalog's size.
        store = get_blob_store(dist_settings)
        for e in engines["items"]:
            with session_scope(dist_settings) as s:
                row = builtengines.get_engine(s, e["id"])
                assert store.size(row.blob_key) == e["size"]

        answer = c.resolve(
            model["name"],
            Machine(
                compute_capability="8.6",
                platform="x86_64",
                trt_rtx_version=by_target["tensorrt-rtx/sm86"]["backend_version"],
            ),
            explain=True,
        )
        assert answer["engine"]["target"] == "tensorrt-rtx/sm86"
        assert answer["match"] == "exact_cc"
        assert "8.6" in answer["reason"]
        # The other GPU engines are rejected with their rule, and so is the CPU artifact: a machine that names
        # TensorRT-RTX is not handed another runtime's file unless it asks (accept=cpu), then only as a fallback.
        assert answer["fallbacks"] == []
        assert {r["target"]: r["rule"] for r in answer["rejected"]}["onnxruntime/cpu-x86_64"] == "named-runtime"
        asked = c.resolve(
            model["name"],
            Machine(
                compute_capability="8.6",
                platform="x86_64",
                trt_rtx_version=by_target["tensorrt-rtx/sm86"]["backend_version"],
            ),
            allow_cpu=True,
        )
        assert asked["engine"]["target"] == "tensorrt-rtx/sm86"
        assert [f["target"] for f in asked["fallbacks"]] == ["onnxruntime/cpu-x86_64"]
        reasons = {r["target"]: r["reason"] for r in answer["rejected"]}
        assert "built for compute capability 8.9" in reasons["tensorrt-rtx/sm89"]

        dest = tmp_path / "fetched.plan"
        sha = c.download(answer["engine"]["id"], dest, answer["engine"]["sha256"])
        assert sha == answer["engine"]["sha256"] == hashlib.sha256(dest.read_bytes()).hexdigest()
        assert dest.stat().st_size == answer["engine"]["size"]


def test_identical_build_is_not_run_again(farm, tmp_path):
    _, model, first = _upload_and_build(farm, tmp_path, ["tensorrt-rtx/sm86", "onnxruntime/cpu-x86_64"], seed=2)
    with Client(farm.url) as c:
        again = c.build(model["id"], ["onnxruntime/cpu-x86_64", "tensorrt-rtx/sm86"], sample_spec())
        # Answered from the catalog at submission: no task is queued, the same engines come back.
        assert {t["state"] for t in again["tasks"]} == {"succeeded"}
        assert all(t["reused"] for t in again["tasks"])
        assert {t["engine_id"] for t in again["tasks"]} == {t["engine_id"] for t in first["tasks"]}
        assert c.engines(model=model["name"])["total"] == 2
        # The same bytes uploaded again under the same name are the same model.
        again_model, created = c.upload(tmp_path / "m.onnx", model["name"])
        assert not created and again_model["id"] == model["id"]


def test_target_without_worker_stays_queued_and_says_why(farm, api, conv_model):
    model = api.post("/v1/models", data={"name": unique_name()}, files={"file": conv_model.open("rb")}).json()
    r = api.post(
        "/v1/builds",
        json={
            "model_id": model["id"],
            "targets": ["tensorrt/sm90"],
            "spec": sample_spec(),
            "queue_without_worker": True,
        },
    )
    assert r.status_code == 202, r.text
    time.sleep(1.5)
    task = api.get(f"/v1/builds/{r.json()['id']}").json()["tasks"][0]
    assert task["state"] == "queued"
    assert task["status_detail"] == "waiting: no live worker serves tensorrt/sm90"


def test_workers_listed_with_their_targets(api):
    live = {w["id"].split("@")[0]: w for w in api.get("/v1/workers").json()}
    assert sorted(live["worker-a"]["targets"]) == sorted(WORKER_A)
    assert sorted(live["worker-b"]["targets"]) == sorted(WORKER_B)
    assert live["worker-a"]["probe"]["modules"]["tensorrt_rtx"]
    assert api.get("/healthz").json()["status"] == "ok"


def test_engine_filters_and_pagination(farm, api, tmp_path):
    _, model, _ = _upload_and_build(
        farm, tmp_path, ["tensorrt-rtx/sm80", "tensorrt-rtx/sm89", "onnxruntime/cpu-x86_64"], seed=3
    )
    name = model["name"]
    assert api.get("/v1/engines", params={"model": name, "cc": "8.9"}).json()["total"] == 1
    assert (
        api.get("/v1/engines", params={"model": name, "backend": "onnxruntime"}).json()["items"][0]["target"]
        == "onnxruntime/cpu-x86_64"
    )
    assert api.get("/v1/engines", params={"model": name, "precision": "fp16"}).json()["total"] == 0
    page1 = api.get("/v1/engines", params={"model": name, "limit": 2}).json()
    page2 = api.get("/v1/engines", params={"model": name, "limit": 2, "offset": 2}).json()
    assert page1["total"] == 3 and len(page1["items"]) == 2 and len(page2["items"]) == 1
    assert not {e["id"] for e in page1["items"]} & {e["id"] for e in page2["items"]}
    content = api.get(f"/v1/engines/{page2['items'][0]['id']}/content", follow_redirects=True)
    farm_answer = content.history[0] if content.history else content  # the farm's own answer: a 307 to S3
    assert farm_answer.headers["X-Content-SHA256"] == hashlib.sha256(content.content).hexdigest()


def test_resolve_explains_when_nothing_fits(farm, api, tmp_path):
    _, model, _ = _upload_and_build(farm, tmp_path, ["tensorrt-rtx/sm86"], seed=4)
    r = api.get("/v1/resolve", params={"model": model["name"], "cc": "9.0", "platform": "x86_64"})
    assert r.status_code == 404
    body = r.json()
    assert "none of the 1 engines" in body["detail"]
    assert "built for compute capability 8.6, you have 9.0" in body["problems"][0]["reason"]
    problem = body["problems"][0]  # its precision tells an fp16 engine from the fp32 one of the same target
    assert problem["precision"] == api.get(f"/v1/engines/{problem['engine_id']}").json()["precision"]
    assert api.get("/v1/resolve", params={"model": "no-such-model"}).status_code == 404
    assert api.get("/v1/resolve", params={"model": model["name"], "cc": "eight"}).status_code == 422


def test_blob_bucket_holds_only_catalogued_bytes(farm, dist_settings):
    """Every object in the bucket is referenced by a model (its bytes or its samples), an engine or a reference
    row: no orphans from uploads and builds (a write still in flight is waited for, not counted)."""
    assert bucket_keys(dist_settings)
    assert orphans(dist_settings, ("",)) == set()


def test_cli_upload_build_fetch(farm, tmp_path):
    """The CLI a user types: upload, build --wait, ls engines, fetch for a described machine."""

    def cli(*args: str) -> str:
        return run_cli(farm.url, *args, cache_dir=tmp_path / "cache")

    model_path = save_conv_net(tmp_path / "cli.onnx", seed=5)
    name = unique_name("cli")
    uploaded = cli("upload", str(model_path), "--name", name)
    model_id = uploaded.split("model ")[1].split()[0]
    built = cli(
        "build",
        model_id,
        "-t",
        "tensorrt-rtx/sm89",
        "-t",
        "onnxruntime/cpu-x86_64",
        "--minShapes",
        "input:1x3x32x32",
        "--optShapes",
        "input:2x3x32x32",
        "--maxShapes",
        "input:4x3x32x32",
        "--wait",
    )
    # Without a terminal, --wait logs one timestamped line per change, then the table.
    assert built.count(": succeeded") == 2 and "2 of 2 targets built" in built
    assert "tensorrt-rtx/sm89" in cli("ls", "engines", "--model", name)
    dest = tmp_path / "out.plan"
    fetched = cli("fetch", name, "-o", str(dest), "--cc", "8.9", "--platform", "x86_64")
    assert "verified" in fetched and "tensorrt-rtx/sm89" in fetched
    with Client(farm.url) as c:
        engine = c.engines(model=name, target="tensorrt-rtx/sm89")["items"][0]
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == engine["sha256"]


def test_bundle_with_external_data_builds(farm, tmp_path):
    """A .zip of model.onnx + its external weights goes through upload, worker unpacking and the builders."""
    import zipfile

    import onnx

    from enginefarm.graph.samples import conv_net

    onnx.save_model(
        conv_net(seed=6),
        str(tmp_path / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    bundle = tmp_path / "bundle.zip"
    with zipfile.ZipFile(bundle, "w") as zf:
        zf.write(tmp_path / "model.onnx", "model.onnx")
        zf.write(tmp_path / "weights.bin", "weights.bin")
    with Client(farm.url) as c:
        model, _ = c.upload(bundle, unique_name("bundle"))
        assert model["format"] == "zip" and model["external_data"]
        build = c.wait_build(
            c.build(model["id"], ["tensorrt-rtx/sm86", "onnxruntime/cpu-x86_64"], sample_spec())["id"],
            timeout=300,
            poll=0.2,
        )
    assert [t["state"] for t in build["tasks"]] == ["succeeded", "succeeded"], build["tasks"]
