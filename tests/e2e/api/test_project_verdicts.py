"""What projects share through identical bytes is the engine file, and nothing a project chose or measured.

Two projects upload the same model bytes and build the same spec: the engine is built once and shared. Each
project's check (its settings, its samples) gives that project's verdict and benchmarks only. Here the second
project checks with inputs near float32's limit, so its outputs overflow and its check fails; the first project's
resolve, release gate, report and engine answer must not move, and neither project sees the other's figures.
"""

from __future__ import annotations

import uuid

import httpx
import numpy as np
import pytest

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.helpers import unique_name

CPU = "onnxruntime/cpu-x86_64"
MACHINE = {"platform": "x86_64"}
# Values a conv net's outputs overflow to inf and NaN on: the accuracy check of these settings fails.
OVERFLOW = {
    "benchmark": {"value_ranges": {"input": [3.0e38, 3.4e38]}, "duration_s": 0.05, "warmup_ms": 10},
    "accuracy": {"batches": 1},
}
QUICK = {"benchmark": {"duration_s": 0.05, "warmup_ms": 10}, "accuracy": {"batches": 1}}


@pytest.fixture(scope="module")
def teams(farm):
    suffix = uuid.uuid4().hex[:6]
    out = {}
    for name in (f"team-a-{suffix}", f"team-b-{suffix}"):
        made = httpx.post(
            f"{farm.url}/v1/tokens",
            headers=farm.headers,
            timeout=30,
            json={"name": f"{name}-build", "scopes": ["build"], "project": name},
        )
        assert made.status_code == 201, made.text
        out[name] = made.json()["token"]
    return out


def _resolve(farm, token: str, name: str, **extra) -> httpx.Response:
    return httpx.post(
        f"{farm.url}/v1/resolve",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
        json={"model": name, "machine": MACHINE, **extra},
    )


def test_another_project_cannot_fail_your_engine(farm, teams, tmp_path):
    a_project, b_project = teams
    path = save_conv_net(tmp_path / "m.onnx", seed=6111)
    name = unique_name("shared-bytes")
    with Client(farm.url, token=teams[a_project]) as a, Client(farm.url, token=teams[b_project]) as b:
        ma, _ = a.upload(path, name)
        # A's own samples: the check of A's settings runs on them, and only A may learn how many there are.
        np.savez(tmp_path / "a.npz", input=np.random.default_rng(5).random((6, 3, 32, 32), np.float32))
        a.upload_samples(ma["id"], tmp_path / "a.npz")
        build_a = a.wait_build(a.build(ma["id"], [CPU], {**sample_spec(), **QUICK})["id"], timeout=300)
        engine_id = build_a["tasks"][0]["engine_id"]
        a.wait_checks(ma["id"], timeout=300)
        before = _resolve(farm, teams[a_project], name)
        assert before.status_code == 200 and before.json()["accuracy"] == "pass", before.text
        assert a.get(f"/v1/models/{ma['id']}/gate")["verdict"] == "pass"
        a_inputs = a.get(f"/v1/engines/{engine_id}")["accuracy"]["inputs"]
        assert "user samples" in a_inputs, a_inputs

        # Project B: the same bytes, the same build spec, checks of its own that overflow.
        mb, _ = b.upload(path, name)
        build_b = b.wait_build(b.build(mb["id"], [CPU], {**sample_spec(), **OVERFLOW})["id"], timeout=300)
        task = build_b["tasks"][0]
        assert task["reused"] and task["engine_id"] == engine_id  # identical work never runs twice
        b.wait_checks(mb["id"], timeout=300)
        b_engine = b.get(f"/v1/engines/{engine_id}")
        assert b_engine["accuracy_pass"] is False, b_engine["accuracy"]
        assert _resolve(farm, teams[b_project], name).status_code == 404  # B is not handed what failed B's check
        assert b.get(f"/v1/models/{mb['id']}/gate")["verdict"] == "fail"

        # A is handed, gated and shown exactly what its own check said.
        after = _resolve(farm, teams[a_project], name)
        assert after.status_code == 200 and after.json()["accuracy"] == "pass", after.text
        assert after.json()["engine"]["id"] == engine_id
        assert a.get(f"/v1/models/{ma['id']}/gate")["verdict"] == "pass"
        a_engine = a.get(f"/v1/engines/{engine_id}")
        assert a_engine["accuracy_pass"] is True and a_engine["accuracy"]["inputs"] == a_inputs
        rows = a.report(ma["id"])["rows"]
        assert rows and {r["accuracy"]["pass"] for r in rows} == {True}
        # Neither sees the other's measurements or the figures its check was made from.
        assert "3e+38" not in str(a.get(f"/v1/engines/{engine_id}/benchmarks"))
        assert "user samples" not in b_engine["accuracy"]["inputs"]  # B's check ran on B's inputs, and says so
        a_bench = a.get(f"/v1/engines/{engine_id}/benchmarks")
        b_bench = b.get(f"/v1/engines/{engine_id}/benchmarks")
        assert a_bench and b_bench and not {x["id"] for x in a_bench} & {x["id"] for x in b_bench}
