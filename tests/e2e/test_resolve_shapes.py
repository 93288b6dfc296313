"""Resolution by what the machine will run, the precision policy, and export agreeing with fetch, end to end.

One model is built three ways for tensorrt-rtx/sm86: with a dynamic batch profile (1..8), with the static shape
1x3x32x32, and as int8 through a derived Q/DQ model (calibrated from samples, never accuracy-checked here: there
is no GPU worker). A second model is built fp32 for sm80 and sm86, then fp16 for sm86 alone. Real PostgreSQL,
Redis, SeaweedFS, uvicorn and Celery workers.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from enginefarm.client import ApiError, Client
from enginefarm.client.tritonexport import PLAN_PREFERENCE, triton_machine
from enginefarm.core.machine import Machine
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.helpers import run_cli, unique_name

SM86 = "tensorrt-rtx/sm86"
CPU = "onnxruntime/cpu-x86_64"
STATIC = {"shapes": {"input": [1, 3, 32, 32]}}
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}


def _wait(c: Client, build: dict) -> dict:
    done = c.wait_build(build["id"], timeout=300, poll=0.2)
    assert {t["state"] for t in done["tasks"]} == {"succeeded"}, done["tasks"]
    return done


@pytest.fixture(scope="module")
def detector(farm, tmp_path_factory):
    """(model, {"dynamic"|"static"|"int8": engine}, the TensorRT-RTX release)."""
    tmp = tmp_path_factory.mktemp("shapes")
    path = save_conv_net(tmp / "m.onnx", seed=61)
    npz = tmp / "samples.npz"
    np.savez(npz, input=np.random.default_rng(61).standard_normal((16, 3, 32, 32)).astype(np.float32))
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("shapes"))
        c.upload_samples(model["id"], npz)
        engines = {}
        for kind, spec, targets in (
            ("dynamic", sample_spec(), [SM86, CPU]),
            ("static", STATIC, [SM86]),
            ("int8", {**sample_spec(), "precision": "int8", "benchmark": QUICK}, [SM86]),
        ):
            done = _wait(c, c.build(model["id"], targets, spec))
            task = next(t for t in done["tasks"] if t["target"] == SM86)
            engines[kind] = c.get(f"/v1/engines/{task['engine_id']}")
    return model, engines, engines["dynamic"]["backend_version"]


@pytest.fixture(scope="module")
def mixed(farm, tmp_path_factory):
    """A model built fp32 for sm80 and sm86 (the spec with the most engines), then fp16 for sm86 alone."""
    path = save_conv_net(tmp_path_factory.mktemp("mixed") / "m.onnx", seed=62)
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("mixed"))
        _wait(c, c.build(model["id"], ["tensorrt-rtx/sm80", SM86], sample_spec()))
        _wait(c, c.build(model["id"], [SM86], {**sample_spec(), "precision": "fp16"}))
    return model


def sm86(rtx: str, **kw) -> Machine:
    return replace(
        Machine(
            gpu_name="NVIDIA GeForce RTX 3090",
            compute_capability="8.6",
            memory_mib=24576,
            driver_version="580.82.07",
            cuda_version="13.0",
            trt_rtx_version=rtx,
            platform="x86_64",
        ),
        **kw,
    )


def batch(n: int) -> dict:
    return {"input": {"min": [n, 3, 32, 32], "opt": [n, 3, 32, 32], "max": [n, 3, 32, 32]}}


def test_engines_carry_their_profiles(detector):
    _, engines, _ = detector
    assert engines["dynamic"]["profiles"] == sample_spec()["profiles"]
    assert engines["static"]["profiles"] == [batch(1)]


def test_the_narrowest_covering_profile_wins_and_a_shape_only_the_dynamic_one_covers_gets_it(farm, api, detector):
    model, engines, rtx = detector
    with Client(farm.url) as c:
        one = c.resolve(model["name"], sm86(rtx, shapes=batch(1)), explain=True)
        four = c.resolve(model["name"], sm86(rtx, shapes=batch(4)), explain=True)
    assert one["engine"]["id"] == engines["static"]["id"]  # both cover 1x3x32x32: the static profile is narrower
    assert one["fallbacks"][0]["engine_id"] == engines["dynamic"]["id"]
    assert four["engine"]["id"] == engines["dynamic"]["id"]
    static = next(r for r in four["rejected"] if r["engine_id"] == engines["static"]["id"])
    assert static["rule"] == "shapes"
    assert static["reason"] == "profile 0 of input 'input' covers 1x3x32x32..1x3x32x32; you need 4x3x32x32"
    assert static["profiles"] == [batch(1)]
    # The same in trtexec syntax on GET, with a range.
    got = api.get(
        "/v1/resolve",
        params={
            "model": model["name"],
            "cc": "8.6",
            "trt_rtx": rtx,
            "platform": "x86_64",
            "min_shapes": "input:2x3x32x32",
            "max_shapes": "input:8x3x32x32",
        },
    )
    assert got.status_code == 200 and got.json()["engine"]["id"] == engines["dynamic"]["id"]


def test_a_shape_nothing_covers_is_a_404_with_the_profiles(api, detector):
    model, engines, rtx = detector
    r = api.get(
        "/v1/resolve",
        params={
            "model": model["name"],
            "cc": "8.6",
            "trt_rtx": rtx,
            "platform": "x86_64",
            "shapes": "input:16x3x32x32",
            "backend": "tensorrt-rtx",
        },
    )
    assert r.status_code == 404, r.text
    problems = {p["engine_id"]: p for p in r.json()["problems"]}
    assert problems[engines["dynamic"]["id"]]["rule"] == "shapes"
    assert (
        problems[engines["dynamic"]["id"]]["reason"]
        == "profile 0 of input 'input' covers 1x3x32x32..8x3x32x32; you need 16x3x32x32"
    )
    bad = api.get("/v1/resolve", params={"model": model["name"], "shapes": "input:1x3xbig"})
    assert bad.status_code == 422 and "dims must be integers" in bad.text and "shapes=images:1x3x640x640" in bad.text


def test_an_unchecked_int8_engine_is_never_the_default_answer(farm, api, detector):
    model, engines, rtx = detector
    int8 = engines["int8"]
    assert int8["precision"] == "int8" and int8["accuracy_pass"] is None
    assert int8["variant_of"] == model["version"] and int8["model_version"].startswith(f"{model['version']}-int8-")
    with Client(farm.url) as c:
        for version in (None, "latest", model["version"]):  # the derived model is a variant of version 1
            answer = c.resolve(model["name"], sm86(rtx), version=version, explain=True)
            assert answer["engine"]["precision"] == "fp32", (version, answer["reason"])
            out = next(r for r in answer["rejected"] if r["engine_id"] == int8["id"])
            assert out["rule"] == "accuracy-gate" and "accuracy was never checked" in out["reason"]
        named = c.resolve(model["name"], sm86(rtx), precision="int8")
        accepted = c.resolve(model["name"], sm86(rtx, precisions=["int8"]))
        unchecked = c.resolve(model["name"], sm86(rtx), accept=["unchecked"], explain=True)
    for answer in (named, accepted):
        assert answer["engine"]["id"] == int8["id"]
        assert answer["accuracy"] == "unchecked" and "accuracy-gate" in answer["unchecked"]
    assert int8["id"] in [r["engine_id"] for r in unchecked["candidates"] if r["rank"]]
    bad = api.post("/v1/resolve", json={"model": model["name"], "accept": ["everything"]})
    assert bad.status_code == 422 and "unchecked" in bad.text


def test_cli_fetch_shapes_explain_shows_profiles(farm, detector, tmp_path):
    model, engines, rtx = detector
    flags = ["--cc", "8.6", "--trt-rtx", rtx, "--platform", "x86_64", "--driver", "580.82.07"]
    out = run_cli(
        farm.url, "fetch", model["name"], *flags, "--shapes", "input:4x3x32x32", "--explain", cache_dir=tmp_path / "c"
    )
    assert "input 1x3x32x32..8x3x32x32" in out and "shapes" in out
    assert "you need 4x3x32x32" in out
    bad = run_cli(
        farm.url, "fetch", model["name"], *flags, "--shapes", "input=4", "--explain", cache_dir=tmp_path / "c", expect=1
    )
    assert "NAME:DxDxD" in bad


def test_export_and_fetch_pick_the_same_engine_for_every_model(farm, detector, mixed, tmp_path):
    """For every model in the catalog and every compute capability it has engines for, the plan export writes is
    the engine fetch picks for a GPU of that compute capability, and no compute capability is left out."""
    from google.protobuf import text_format

    from tests.triton_model_config import ModelConfig

    with Client(farm.url) as c:
        models = [m for m in c.models(limit=500)["items"] if m["source_model_id"] is None]
        names = sorted({m["name"] for m in models})
        compared = 0
        for name in names:
            engines = c.engines(model=name, limit=500)["items"]
            if not any(e["compute_capability"] and e["backend"] in PLAN_PREFERENCE for e in engines):
                continue
            out = tmp_path / f"repo-{name}"  # one each: a model with no plan writes no plan model to replace
            run_cli(
                farm.url,
                "export",
                "triton",
                name,
                "--out",
                str(out),
                "--name",
                "m",
                "--overwrite",
                cache_dir=tmp_path / "cache",
            )
            config = out / "m" / "config.pbtxt"
            files = (
                dict(text_format.Parse(config.read_text(), ModelConfig()).cc_model_filenames) if config.exists() else {}
            )
            exported = {cc: hashlib.sha256((out / "m" / "1" / f).read_bytes()).hexdigest() for cc, f in files.items()}
            # Its versions asked by name: the suite's whole catalog is longer than one page of GET /v1/models.
            versions = [m for m in c.models(name=name, limit=500)["items"] if m["source_model_id"] is None]
            version = max(versions, key=lambda m: m["id"])["version"]
            for cc in sorted({e["compute_capability"] for e in engines if e["compute_capability"]}):
                try:
                    answer = c.resolve(name, triton_machine(cc), version=version)
                    picked = answer["engine"]["sha256"] if answer["engine"]["backend"] in PLAN_PREFERENCE else None
                except ApiError as exc:
                    assert exc.status_code == 404
                    picked = None
                assert exported.get(cc) == picked, (name, cc)
                compared += 1
    assert compared >= 3
    # The case that used to disagree: fp32 has the most engines, but sm86's newest engine is fp16.
    with Client(farm.url) as c:
        answer = c.resolve(mixed["name"], triton_machine("8.6"))
    assert answer["engine"]["precision"] == "fp16"


def test_a_build_asked_for_shapes_nothing_covers_gets_a_profile_that_covers_them(api, detector):
    """resolve with build=true and shapes no engine covers: the build it submits covers those shapes (one profile
    more than the spec it starts from), instead of building the latest spec again."""
    model, engines, rtx = detector
    r = api.get(
        "/v1/resolve",
        params={
            "model": model["name"],
            "cc": "8.6",
            "trt_rtx": rtx,
            "platform": "x86_64",
            "shapes": "input:16x3x32x32",
            "backend": "tensorrt-rtx",
            "build": "true",
        },
    )
    assert r.status_code == 202, r.text
    build = api.get(f"/v1/builds/{r.json()['build_id']}").json()
    profiles = build["spec"]["profiles"]
    assert any(p["input"]["min"][0] <= 16 <= p["input"]["max"][0] for p in profiles), profiles
    assert len(profiles) == 2 and profiles[0]["input"]["max"][0] < 16  # the spec's own profile is kept
