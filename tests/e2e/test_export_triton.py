"""`enginefarm export triton` against a real farm for a model with plans of sm86 and sm120 only: no default plan
(Triton would hand it to every other GPU), a warning naming the compute capabilities served, and an int8 engine
exported only once its accuracy check passed. Real PostgreSQL, Redis, SeaweedFS, uvicorn and Celery workers."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.helpers import run_cli, unique_name
from tests.triton_model_config import ModelConfig

SM86, SM120 = "tensorrt-rtx/sm86", "tensorrt-rtx/sm120"
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}


@pytest.fixture(scope="module")
def two_gpus(farm, tmp_path_factory):
    """A model with fp32 plans of sm86 and sm120 and an int8 plan of sm86 (from samples, never checked here: there
    is no GPU worker); returns (name, int8 engine)."""
    tmp = tmp_path_factory.mktemp("triton")
    path = save_conv_net(tmp / "m.onnx", seed=613)
    npz = tmp / "samples.npz"
    np.savez(npz, input=np.random.default_rng(613).standard_normal((16, 3, 32, 32)).astype(np.float32))
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("triton"))
        c.upload_samples(model["id"], npz)
        for spec, targets in (
            (sample_spec(), [SM86, SM120]),
            ({**sample_spec(), "precision": "int8", "benchmark": QUICK}, [SM86]),
        ):
            done = c.wait_build(c.build(model["id"], targets, spec)["id"], timeout=300, poll=0.2)
            assert {t["state"] for t in done["tasks"]} == {"succeeded"}, done["tasks"]
        int8 = c.get(f"/v1/engines/{done['tasks'][0]['engine_id']}")
    assert int8["precision"] == "int8" and int8["accuracy_pass"] is None
    return model["name"], int8


def test_plans_of_sm86_and_sm120_only_give_no_default(farm, two_gpus, tmp_path):
    name, _ = two_gpus
    out = tmp_path / "repo"
    printed = run_cli(
        farm.url, "export", "triton", name, "--out", str(out), "--name", "m", cache_dir=tmp_path / "cache", stderr=True
    )
    text = (out / "m" / "config.pbtxt").read_text()
    cfg = text_format.Parse(text, ModelConfig())
    assert dict(cfg.cc_model_filenames) == {"8.6": "model_sm86.plan", "12.0": "model_sm120.plan"}
    assert "default_model_filename" not in text and not cfg.default_model_filename
    assert "no default_model_filename" in printed and "compute capability 8.6, 12.0 and on no other" in printed
    assert sorted(p.name for p in (out / "m" / "1").iterdir()) == ["model_sm120.plan", "model_sm86.plan"]


def test_an_unchecked_int8_engine_is_not_exported(farm, two_gpus, tmp_path):
    name, int8 = two_gpus
    out = tmp_path / "repo"
    refused = run_cli(
        farm.url,
        "export",
        "triton",
        name,
        "--out",
        str(out),
        "--precision",
        "int8",
        cache_dir=tmp_path / "cache",
        expect=1,
    )
    assert f"not exporting engine {int8['id']} (tensorrt-rtx/sm86, int8)" in refused
    assert "has not passed (check pending" in refused and "--accept unchecked" in refused
    assert not out.exists()
    # Asked for by name, unchecked: exported.
    run_cli(
        farm.url,
        "export",
        "triton",
        name,
        "--out",
        str(out),
        "--precision",
        "int8",
        "--accept",
        "unchecked",
        "--name",
        "m",
        cache_dir=tmp_path / "cache",
    )
    cfg = text_format.Parse((out / "m" / "config.pbtxt").read_text(), ModelConfig())
    assert dict(cfg.cc_model_filenames) == {"8.6": "model_sm86.plan"}
