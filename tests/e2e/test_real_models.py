"""Real models through the whole farm (API, Celery workers, PostgreSQL, Redis, SeaweedFS): what the matrix checks
stage by stage, here with the catalog rows, the build summary and the CLI a user sees."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.client import ApiError, Client
from tests.helpers import run_cli, unique_name
from tests.realmodels import MODELS, path, samples

CPU = "onnxruntime/cpu-x86_64"
QUICK = {"warmup_ms": 20, "duration_s": 0.2, "iterations": 5}


def _upload(c: Client, name: str, with_samples: bool, tmp_path) -> dict:
    model, _ = c.upload(path(name), unique_name(name))
    if with_samples:
        npz = tmp_path / f"{name}.npz"
        np.savez(npz, **samples(name, 8, seed=2))
        model = c.upload_samples(model["id"], npz)
    return model


def test_bert_int8_from_samples_builds_benchmarks_and_checks(farm, tmp_path):
    spec = {**MODELS["bert"].shapes, "precision": "int8", "benchmark": QUICK}
    with Client(farm.url) as c:
        model = _upload(c, "bert", True, tmp_path)
        build = c.build(model["id"], ["tensorrt-rtx/sm86", CPU], spec)
        done = c.wait_build(build["id"], timeout=600, poll=0.3)
        assert done["quantize"]["state"] == "succeeded", done["quantize"]
        assert [t["state"] for t in done["tasks"]] == ["succeeded", "succeeded"], [t["error"] for t in done["tasks"]]
        report = c.wait_checks(done["quantize"]["derived_model_id"], timeout=300)
        (cpu,) = [r for r in report["rows"] if r["target"] == CPU]
        assert cpu["status"] == "measured" and cpu["latency_ms"]["median"] > 0, cpu
        assert cpu["accuracy"]["pass"] is True, cpu["accuracy"]
        assert "user samples" in cpu["accuracy"]["inputs"]
        (gpu,) = [r for r in report["rows"] if r["target"] == "tensorrt-rtx/sm86"]
        assert gpu["status"] == "pending" and "no worker with an sm86 GPU" in gpu["detail"]
        summary = c.get(f"/v1/builds/{build['id']}")["summary"]
        assert summary.startswith("2 of 2 targets built; checks: 1 passed") and "1 pending" in summary


def test_bert_benchmark_on_generated_token_ids_stays_inside_the_vocabulary(farm, tmp_path):
    """Without samples, integer inputs that index an embedding table get values inside it (they were 0..7 and the
    2-row token-type table made the benchmark crash)."""
    with Client(farm.url) as c:
        model = _upload(c, "bert", False, tmp_path)
        ranges = {t["name"]: t for t in model["inputs"]}
        assert set(ranges) == {"input_ids", "attention_mask", "token_type_ids"}
        build = c.build(model["id"], [CPU], {**MODELS["bert"].shapes, "benchmark": QUICK})
        c.wait_build(build["id"], timeout=300, poll=0.3)
        report = c.wait_checks(model["id"], timeout=300)
        (cpu,) = [r for r in report["rows"] if r["target"] == CPU]
        assert cpu["status"] == "measured", cpu
        assert cpu["accuracy"]["pass"] is True and "seeded random" in cpu["accuracy"]["inputs"]
        engine = c.get(f"/v1/engines/{cpu['engine_id']}")
        assert engine["checks"]["state"] == "succeeded", engine["checks"]


def test_shared_batch_dims_that_disagree_get_a_422_before_any_build(farm, tmp_path):
    seq = {"min": [1, 8], "opt": [2, 64], "max": [4, 128]}
    profile = {"input_ids": seq, "token_type_ids": seq, "attention_mask": {**seq, "min": [2, 8]}}
    with Client(farm.url) as c:
        model = _upload(c, "bert", False, tmp_path)
        with pytest.raises(ApiError) as refused:
            c.build(
                model["id"],
                ["tensorrt-rtx/sm75", "tensorrt-rtx/sm86"],
                {"profiles": [profile], "precision_fallback": False},
            )
        assert refused.value.status_code == 422
        text = str(refused.value.body)
        assert "share the dim 'batch'" in text and "FP32 GEMM is not supported" in text
        assert c.builds(model_id=model["id"]) == []


def test_yolov8_fp16_builds_and_its_log_is_one_command_away(farm, tmp_path):
    spec = {
        **MODELS["yolov8n"].shapes,
        "precision": "fp16",
        "benchmark": {"enabled": False},
        "accuracy": {"enabled": False},
    }
    with Client(farm.url) as c:
        model = _upload(c, "yolov8n", False, tmp_path)
        build = c.build(model["id"], ["tensorrt-rtx/sm86"], spec)
        done = c.wait_build(build["id"], timeout=300, poll=0.3)
        assert done["tasks"][0]["state"] == "succeeded", done["tasks"][0]["error"]
    printed = run_cli(farm.url, "logs", str(build["id"]), "--target", "tensorrt-rtx/sm86")
    assert "tensorrt-rtx/sm86: succeeded" in printed and "fp16" in printed and "built tensorrt-rtx/sm86" in printed
    run_cli(farm.url, "logs", str(build["id"]), "--target", "tensorrt-rtx/sm89", expect=1)
