"""GET /v1/models/{id}/gate on the real farm: per target × check a verdict with its reason and numbers, and the
verdict over all of them; pending checks on hardware the farm lacks pass or fail as asked; another project's model
is 404 and bad parameters are 422 naming the parameter."""

from __future__ import annotations

import httpx
import pytest

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.badmodels import custom_op_model
from tests.helpers import unique_name

CPU = "onnxruntime/cpu-x86_64"
RTX = "tensorrt-rtx/sm86"  # built on this machine, never benchmarked: the farm has no sm86 GPU
QUICK = {"warmup_ms": 20, "duration_s": 0.2, "iterations": 10}
CHECKS = ["build", "benchmark", "accuracy", "latency_regression"]


def _checks(target: dict) -> dict[str, dict]:
    return {c["check"]: c for c in target["checks"]}


@pytest.fixture(scope="module")
def built(farm, tmp_path_factory):
    """A model built for the CPU (measured and checked here) and for sm86 (its benchmark waits for a GPU)."""
    path = save_conv_net(tmp_path_factory.mktemp("gate") / "m.onnx", seed=501)
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("gate"))
        build = c.build(model["id"], [CPU, RTX], {**sample_spec(), "benchmark": QUICK})
        done = c.wait_build(build["id"], timeout=300, poll=0.3)
        assert {t["state"] for t in done["tasks"]} == {"succeeded"}, done["tasks"]
        c.wait_checks(model["id"], timeout=120)
    return model, build


def test_a_good_build_passes_and_pending_hardware_counts_as_asked(api, built):
    model, build = built
    answer = api.get(f"/v1/models/{model['id']}/gate")
    assert answer.status_code == 200, answer.text
    gate = answer.json()
    assert gate["verdict"] == "pass" and gate["pending"] == "pass" and gate["previous"] is None
    assert [t["target"] for t in gate["targets"]] == sorted([CPU, RTX])
    by_target = {t["target"]: t for t in gate["targets"]}
    cpu = _checks(by_target[CPU])
    assert list(cpu) == CHECKS and {c["verdict"] for c in cpu.values()} == {"pass"}
    assert cpu["build"]["numbers"]["build_id"] == build["id"]
    (shape,) = cpu["benchmark"]["numbers"]["shapes"]
    assert shape["shape_key"] == "opt" and shape["median_ms"] > 0
    assert cpu["accuracy"]["numbers"]["metrics"]["cosine"] > 0.9999
    assert cpu["latency_regression"]["reason"] == "first version of the model: nothing to compare against"

    rtx = _checks(by_target[RTX])
    assert rtx["build"]["verdict"] == "pass"
    for name in ("benchmark", "accuracy"):
        assert rtx[name]["verdict"] == "pending" and rtx[name]["in_progress"] is False
    assert rtx["benchmark"]["reason"].startswith("benchmark pending: no worker with an sm86 GPU and tensorrt_rtx; ")
    assert "`enginefarm measure --engine " in rtx["benchmark"]["reason"]
    assert gate["counts"]["pending"] == 3 and "counted as passed (pending=pass)" in gate["reason"]

    strict = api.get(f"/v1/models/{model['id']}/gate", params={"pending": "fail"}).json()
    assert strict["verdict"] == "fail" and "pending (pending=fail)" in strict["reason"]
    assert "no worker with an sm86 GPU" in strict["reason"]
    # Gating only the CPU target, named as a user would (comma-separated works too), passes strictly.
    only_cpu = api.get(
        f"/v1/models/{model['id']}/gate", params={"pending": "fail", "targets": CPU, "build_id": build["id"]}
    ).json()
    assert only_cpu["verdict"] == "pass" and [t["target"] for t in only_cpu["targets"]] == [CPU]


def test_a_failed_build_and_an_unbuilt_target_fail_with_the_reason(farm, api, tmp_path):
    with Client(farm.url) as c:
        model, _ = c.upload(custom_op_model(tmp_path / "custom.onnx"), unique_name("gate-bad"))
        build = c.build(model["id"], [CPU], {"benchmark": QUICK})
        c.wait_build(build["id"], timeout=300, poll=0.3)
    gate = api.get(f"/v1/models/{model['id']}/gate", params={"targets": [CPU, "tensorrt-rtx/sm89"]}).json()
    assert gate["verdict"] == "fail"
    cpu, sm89 = (_checks(t) for t in gate["targets"])
    assert cpu["build"]["verdict"] == "fail" and "ONNX Runtime could not load the model" in cpu["build"]["reason"]
    assert all(
        cpu[c]["verdict"] == "fail" and cpu[c]["reason"] == "no engine: the build did not succeed" for c in CHECKS[1:]
    )
    assert sm89["build"]["reason"] == "the model has no build for tensorrt-rtx/sm89; submit one (POST /v1/builds)"
    assert "ONNX Runtime could not load the model" in gate["reason"]


def test_another_projects_model_is_404(farm, api, built):
    model, _ = built
    made = api.post("/v1/tokens", json={"name": "gate-reader", "scopes": ["read"], "project": unique_name("p")})
    assert made.status_code == 201, made.text
    other = httpx.get(
        f"{farm.url}/v1/models/{model['id']}/gate",
        headers={"Authorization": f"Bearer {made.json()['token']}"},
        timeout=30,
    )
    assert other.status_code == 404 and other.json()["detail"] == f"no model with id {model['id']}"


@pytest.mark.parametrize(
    "params, where, words",
    [
        ({"max_regression_pct": "-1"}, "max_regression_pct", "greater than or equal to 0"),
        ({"max_regression_pct": "nan"}, "max_regression_pct", "finite number"),
        ({"pending": "maybe"}, "pending", "'pass' or 'fail'"),
        ({"targets": "tensorrt/sm999"}, "targets", "tensorrt cannot build for 'sm999'"),
        ({"targets": "cpu"}, "targets", "must be written BACKEND/ARCH"),
        ({"build_id": "0"}, "build_id", "greater than or equal to 1"),
        ({"spec_hash": "abc"}, "spec_hash", "should match pattern"),
    ],
)
def test_bad_parameters_are_422_naming_the_parameter(api, built, params, where, words):
    model, _ = built
    answer = api.get(f"/v1/models/{model['id']}/gate", params=params)
    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["detail"]
    assert problem["loc"] == ["query", where] and words in problem["msg"], problem


def test_a_build_of_another_model_or_a_target_it_lacks_is_422(farm, api, built, tmp_path):
    model, build = built
    with Client(farm.url) as c:
        other, _ = c.upload(save_conv_net(tmp_path / "o.onnx", seed=502), unique_name("gate-other"))
    answer = api.get(f"/v1/models/{other['id']}/gate", params={"build_id": build["id"]})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["msg"].startswith(f"build {build['id']} is not a build of this model")
    answer = api.get(f"/v1/models/{model['id']}/gate", params={"build_id": build["id"], "targets": "tensorrt-rtx/sm89"})
    assert answer.status_code == 422 and "has no task for tensorrt-rtx/sm89" in answer.json()["detail"][0]["msg"]
