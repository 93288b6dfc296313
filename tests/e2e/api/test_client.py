"""The Python client against a real farm: errors come back as the classes the server raised, builds are job
objects, uploads are idempotent by sha256 and take a path or bytes, models are named by id, name or name:version,
and fetch writes a file only under a name that says what it is."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from enginefarm.client import ApiError, BuildJob, Client
from enginefarm.client.artifacts import MODEL_PROTO_FIELDS, is_onnx_model, place_cached
from enginefarm.client.cache import EngineCache
from enginefarm.core.errors import (
    IntegrityError,
    NoCompatibleEngine,
    NotFound,
    SpecInvalid,
    TooBusy,
    Unauthorized,
    WrongArtifact,
)
from enginefarm.core.machine import Machine
from enginefarm.graph.samples import conv_net, sample_spec
from tests.helpers import unique_name

CPU = "onnxruntime/cpu-x86_64"


@pytest.fixture
def client(farm):
    with Client(farm.url, token=farm.token) as c:
        yield c


def test_an_invalid_spec_raises_spec_invalid_with_every_problem(client):
    model, _ = client.upload(conv_net(seed=401).SerializeToString(), name=unique_name("typed"))
    with pytest.raises(SpecInvalid) as exc:
        client.build(model["id"], ["tensorrt-rtx/sm99", "nope/x"], {"precision": "fp16"})
    assert isinstance(exc.value, ApiError) and exc.value.status_code == 422
    assert len(exc.value.problems) >= 2 and "sm99" in str(exc.value.problems)


def test_request_validation_is_spec_invalid_with_its_problems(client):
    with pytest.raises(SpecInvalid) as exc:
        client.build(1, targets=3)  # not a list: FastAPI's own 422, with no error name
    assert exc.value.status_code == 422 and any("targets" in p["loc"] for p in exc.value.problems), exc.value.problems


def test_typed_errors_for_unknown_models_and_bad_tokens(client, farm):
    with pytest.raises(NotFound) as exc:
        client.get("/v1/models/999999999")
    assert exc.value.status_code == 404 and "999999999" in str(exc.value)
    with pytest.raises(NotFound, match="no model 'never-uploaded-x'"):
        client.model_id("never-uploaded-x")
    with Client(farm.url, token="ef_not_a_real_token") as stranger, pytest.raises(Unauthorized) as exc:
        stranger.models()
    assert exc.value.status_code == 401 and isinstance(exc.value, ApiError)


def test_an_answer_with_no_error_name_is_typed_by_its_status():
    from enginefarm.client.errors import api_error

    e = api_error(422, {"detail": [{"loc": ["body", "targets"], "msg": "Input should be a valid list"}]})
    assert isinstance(e, SpecInvalid) and e.problems == [
        {"loc": ["body", "targets"], "msg": "Input should be a valid list"}
    ]
    busy = api_error(429, {"error": "QueueFull", "detail": "full"}, "60")
    assert isinstance(busy, TooBusy) and type(busy).__name__ == "QueueFull" and busy.retry_after == 60
    assert type(api_error(502, "<html>bad gateway</html>")) is ApiError


def test_upload_is_idempotent_by_sha256_and_takes_bytes_or_a_path(client, tmp_path):
    name, data = unique_name("idem"), conv_net(seed=402).SerializeToString()
    first, created = client.upload(data, name=name)
    assert created and first["sha256"] == hashlib.sha256(data).hexdigest()
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(data)
    sent = []
    again, created = client.upload(path, on_bytes=sent.append)  # the name defaults to the file's stem
    assert not created and again["id"] == first["id"]
    assert sent == []  # the farm had these bytes under this name: none were sent


def test_a_build_is_a_job_to_wait_for_and_download(client, tmp_path):
    name = unique_name("job")
    model, _ = client.upload(conv_net(seed=403).SerializeToString(), name=name)
    job = client.build(name, [CPU], sample_spec())  # by name: its newest version
    assert isinstance(job, BuildJob) and job["model_id"] == model["id"] == client.model_id(f"{name}:1")
    assert job.wait(timeout=120) is job and job.state == "succeeded"
    paths = job.download_all(tmp_path / "engines")
    engine = client.get(f"/v1/engines/{job.tasks[0]['engine_id']}")
    assert list(paths) == [CPU] and paths[CPU].name == "onnxruntime-cpu-x86_64.onnx"
    assert hashlib.sha256(paths[CPU].read_bytes()).hexdigest() == engine["sha256"]
    assert client.job(job.id)["id"] == job.id


def test_a_job_still_running_is_not_downloaded(client, tmp_path):
    job = BuildJob(client, {"id": 7, "state": "running", "tasks": [{"state": "running", "target": CPU}]})
    with pytest.raises(RuntimeError, match="wait"):
        job.download_all(tmp_path)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ fetch: what the file is, and accept=cpu

SM86 = "tensorrt-rtx/sm86"


@pytest.fixture(scope="module")
def two_kinds(farm):
    """A model built for tensorrt-rtx/sm86 and ONNX Runtime on the CPU: (name, engines by target, an sm86 machine
    with the workers' TensorRT-RTX)."""
    with Client(farm.url, token=farm.token) as c:
        model, _ = c.upload(conv_net(seed=404).SerializeToString(), name=unique_name("kinds"))
        assert c.build(model["id"], [SM86, CPU], sample_spec()).wait(timeout=300).state == "succeeded"
        engines = {e["target"]: e for e in c.engines(model=model["name"])["items"]}
    machine = Machine(
        gpu_name="NVIDIA GeForce RTX 3090",
        compute_capability="8.6",
        memory_mib=24576,
        driver_version="580.82.07",
        cuda_version="13.0",
        platform="x86_64",
        trt_rtx_version=engines[SM86]["backend_version"],
    )
    return model["name"], engines, machine


def test_fetch_names_the_file_by_what_it_is_and_refuses_another_name(client, two_kinds, tmp_path):
    name, engines, machine = two_kinds
    sizes: list[int] = []
    heard: list[int] = []
    got = client.fetch(name, tmp_path, machine, on_size=sizes.append, on_bytes=lambda n: heard.append(len(sizes)))
    assert got.path == tmp_path / f"{name}-tensorrt-rtx-sm86.plan"  # a folder: the file is named there
    assert hashlib.sha256(got.path.read_bytes()).hexdigest() == engines[SM86]["sha256"]
    assert sizes == [got.path.stat().st_size]  # a progress bar's total, heard before the first byte
    assert heard and set(heard) == {1}
    cache = EngineCache(tmp_path / "cache")
    for dest, backend in (("x.plan", "onnxruntime"), ("x.onnx", "tensorrt-rtx")):
        with pytest.raises(WrongArtifact, match=f"not writing {dest}"):
            client.fetch(name, tmp_path / "out" / dest, machine, backend=backend)
        with pytest.raises(WrongArtifact):
            client.fetch(name, tmp_path / "out" / dest, machine, backend=backend, cache=cache)
    assert not (tmp_path / "out").exists() and cache.records() == []  # refused before any byte came


def test_allow_cpu_sends_accept_cpu(client, two_kinds):
    """``allow_cpu`` puts ``cpu`` in the request's ``accept``, beside what the caller accepts: the farm answers the
    ONNX Runtime model to a GPU machine nothing of its runtime fits, which it refuses without it."""
    name, engines, machine = two_kinds
    sent: list[dict] = []
    client.http.event_hooks["request"] = [lambda request: sent.append(json.loads(request.content))]
    batch64 = replace(
        machine, shapes={"input": {"min": [64, 3, 32, 32], "opt": [64, 3, 32, 32], "max": [64, 3, 32, 32]}}
    )
    answer = client.resolve(name, batch64, allow_cpu=True, accept=["unchecked"])
    assert answer["engine"]["id"] == engines[CPU]["id"]
    assert sent[-1]["accept"] == ["cpu", "unchecked"]
    with pytest.raises(NoCompatibleEngine):  # the same machine, not asking: nothing of its runtime fits
        client.resolve(name, batch64)
    client.resolve(name, machine)
    assert "accept" not in sent[-1]  # not asked, not sent


def test_the_bytes_of_each_kind_are_told_apart_without_onnx(client, two_kinds, tmp_path):
    """An ONNX model is a ModelProto (its top-level fields, walked); a TensorRT-RTX plan is not; nor is a cut or
    empty file."""
    _, engines, _ = two_kinds
    model, plan = tmp_path / "m.onnx", tmp_path / "e.plan"
    client.download(engines[CPU]["id"], model, engines[CPU]["sha256"])
    client.download(engines[SM86]["id"], plan, engines[SM86]["sha256"])
    assert is_onnx_model(model) and not is_onnx_model(plan)
    cut, empty = tmp_path / "cut.onnx", tmp_path / "empty.onnx"
    cut.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    empty.write_bytes(b"")
    assert not is_onnx_model(cut) and not is_onnx_model(empty)
    # A field a later onnx adds (number 40, a varint) is stepped over; the same bytes with a byte more are not ONNX.
    later, extra = tmp_path / "later.onnx", tmp_path / "extra.onnx"
    key = bytes([(40 << 3) & 0x7F | 0x80, 40 << 3 >> 7])  # field 40, wire type 0, as a varint
    later.write_bytes(model.read_bytes() + key + b"\x01")
    extra.write_bytes(model.read_bytes() + key)
    assert is_onnx_model(later) and not is_onnx_model(extra)
    # The field table is onnx's own ModelProto (varints for the two integers, length-delimited for the rest).
    import onnx

    assert MODEL_PROTO_FIELDS == {
        f.number: 0 if f.type == f.TYPE_INT64 else 2 for f in onnx.ModelProto.DESCRIPTOR.fields
    }


def test_a_cached_blob_not_of_its_records_kind_is_evicted_and_not_written(client, two_kinds, tmp_path):
    """A record that says plan over bytes that are an ONNX model: refused, the blob evicted, nothing at the
    destination (a farm's record and bytes that disagree never reach a deploy script)."""
    _, engines, _ = two_kinds
    cache = EngineCache(tmp_path / "cache")
    client.cached(engines[CPU], cache)
    lying = {**engines[CPU], "backend": "tensorrt-rtx", "target": SM86}
    with pytest.raises(IntegrityError, match="its bytes are an ONNX model"):
        place_cached(cache, lying, tmp_path / "x.plan")
    assert not cache.has(engines[CPU]["sha256"]) and not (tmp_path / "x.plan").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]
