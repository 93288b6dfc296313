"""The Python client against a real farm: errors come back as the classes the server raised, builds are job
objects, uploads are idempotent by sha256 and take a path or bytes, models are named by id, name or name:version."""

from __future__ import annotations

import hashlib

import pytest

from enginefarm.client import ApiError, BuildJob, Client
from enginefarm.errors import NotFound, SpecInvalid, TooBusy, Unauthorized
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
    assert isinstance(e, SpecInvalid) and e.problems == [{"loc": ["body", "targets"], "msg": "Input should be a valid list"}]
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
