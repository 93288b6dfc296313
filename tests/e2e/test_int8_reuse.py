"""A second int8 build of the same model, spec and samples reuses the engines the first made: the quantize stage
derives the same Q/DQ model, finds its engine in the catalog and queues that project's check of it."""

from __future__ import annotations

import numpy as np

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.helpers import unique_name

GPU = "tensorrt-rtx/sm86"  # TensorRT's int8 recipe has no timed choice: the same inputs give the same bytes


def test_a_repeated_int8_build_reuses_the_engine_the_first_one_made(farm, tmp_path):
    path = save_conv_net(tmp_path / "m.onnx", seed=77)
    npz = tmp_path / "samples.npz"
    np.savez(npz, input=np.random.default_rng(77).standard_normal((8, 3, 32, 32)).astype(np.float32))
    spec = {**sample_spec(), "precision": "int8"}
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("reuse"))
        c.upload_samples(model["id"], npz)
        first = c.wait_build(c.build(model["id"], [GPU], spec)["id"], timeout=300, poll=0.2)
        assert [t["state"] for t in first["tasks"]] == ["succeeded"], first
        second = c.wait_build(c.build(model["id"], [GPU], spec)["id"], timeout=300, poll=0.2)
    assert second["quantize"]["state"] == "succeeded", second["quantize"]
    assert [t["state"] for t in second["tasks"]] == ["succeeded"], second["tasks"]
    assert second["tasks"][0]["engine_id"] == first["tasks"][0]["engine_id"]
