"""POST /v1/builds validation: every problem listed at once, nothing written when rejected."""

from __future__ import annotations

import pytest

from enginefarm.graph.samples import conv_net, sample_spec
from storage import catalog
from storage.db import session_scope
from tests.helpers import unique_name


@pytest.fixture(scope="module")
def model_id(farm):
    import httpx

    with httpx.Client(base_url=farm.url, headers=farm.headers) as c:
        r = c.post(
            "/v1/models",
            data={"name": unique_name("spec")},
            files={"file": ("m.onnx", conv_net(seed=2101).SerializeToString())},
        )
        return r.json()["id"]


def _builds(settings) -> int:
    with session_scope(settings) as s:
        return len(catalog.list_builds(s, limit=10_000))


def test_every_problem_is_listed_at_once(api, dist_settings, model_id):
    before = _builds(dist_settings)
    spec = {
        "precision": "int8",
        "profiles": [
            {
                "input": {"min": [4, 3, 32, 32], "opt": [2, 3, 32, 32], "max": [8, 3, 32, 32]},
                "image": {"min": [1], "opt": [1], "max": [1]},
            },
            {"input": {"min": [1, 3, 32], "opt": [1, 3, 32], "max": [1, 3, 32]}},
            {},
        ],
    }
    r = api.post(
        "/v1/builds",
        json={"model_id": model_id, "targets": ["tensorrt-rtx/sm86", "tensorrt-rtx/sm99", "nope/x"], "spec": spec},
    )
    assert r.status_code == 422, r.text
    msgs = " | ".join(p["msg"] for p in r.json()["problems"])
    for expected in (
        "min <= opt <= max",
        "unknown input 'image'",
        "has rank 4",
        "profile 2 gives it no shapes",
        "Q/DQ",
        "cannot build for 'sm99'",
        "unknown backend 'nope'",
    ):
        assert expected in msgs, msgs
    assert _builds(dist_settings) == before


def test_dynamic_input_without_shapes(api, model_id):
    r = api.post("/v1/builds", json={"model_id": model_id, "targets": ["tensorrt-rtx/sm86"], "spec": {}})
    assert r.status_code == 422
    assert "has dynamic dims" in r.json()["problems"][0]["msg"]


@pytest.mark.parametrize(
    "spec,targets,message",
    [
        ({"precision": "fp64"}, ["tensorrt-rtx/sm86"], "Input should be"),
        ({"workspace_mib": -5}, ["tensorrt-rtx/sm86"], "greater than or equal to 1"),
        ({"unknown_knob": 1}, ["tensorrt-rtx/sm86"], "Extra inputs are not permitted"),
        (
            {"precision": "bf16", "precision_fallback": False},
            ["onnxruntime/cpu-x86_64"],
            "CPU backend builds fp32, fp16 or int8",
        ),
        (
            {"precision": "bf16", "precision_fallback": False},
            ["tensorrt-rtx/sm75"],
            "bf16 needs compute capability 8.0",
        ),
        ({"hardware_compatibility": "ampere_plus"}, ["tensorrt/sm75"], "ampere_plus needs an sm80+"),
        ({}, ["tensorrt-rtx/sm86", "tensorrt-rtx/sm86"], "listed twice"),
        ({"shapes": {"input": [1, 3, 64, 64]}}, ["tensorrt-rtx/sm86"], "fixed at 32"),
    ],
    ids=[
        "bad-precision",
        "negative-workspace",
        "unknown-field",
        "fp16-on-cpu",
        "bf16-sm75",
        "ampere-plus-sm75",
        "duplicate-target",
        "static-dim-mismatch",
    ],
)
def test_spec_rejections(api, model_id, spec, targets, message):
    body = {"model_id": model_id, "targets": targets, "spec": {**sample_spec(), **spec}}
    if "shapes" in spec:
        body["spec"].pop("profiles")
    r = api.post("/v1/builds", json=body)
    assert r.status_code == 422, r.text
    assert message in str(r.json()), r.json()


def test_unknown_model_and_empty_targets(api):
    assert api.post("/v1/builds", json={"model_id": 987654, "targets": ["tensorrt-rtx/sm86"]}).status_code == 404
    assert api.post("/v1/builds", json={"model_id": 1, "targets": []}).status_code == 422
    assert api.get("/v1/builds/987654").status_code == 404


def test_trtexec_shapes_from_the_cli_build_the_same_spec(model_id, farm, tmp_path):
    """`enginefarm build --minShapes/--optShapes/--maxShapes` submits the profile the API would take as JSON."""
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "enginefarm",
            "build",
            str(model_id),
            "-t",
            "tensorrt-rtx/sm89",
            "--api",
            farm.url,
            "--minShapes",
            "input:1x3x32x32",
            "--optShapes",
            "input:4x3x32x32",
            "--maxShapes",
            "input:8x3x32x32",
            "--wait",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "succeeded" in out.stdout
