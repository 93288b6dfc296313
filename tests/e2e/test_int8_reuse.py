"""A second int8 build of the same model, spec and samples reuses the engines the first made: the quantize stage
derives the same Q/DQ model, finds its engine in the catalog and queues that project's check of it."""

from __future__ import annotations

import numpy as np

from enginefarm.client import Client
from enginefarm.core.errors import NoCompatibleEngine
from enginefarm.core.machine import Machine
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


def test_a_new_version_of_the_same_bytes_resolves_to_the_int8_engine_it_reused(farm, tmp_path):
    """Version 2 uploads version 1's bytes and samples again; its int8 build derives the same Q/DQ model and reuses
    version 1's engine. Resolving version 2 must find that engine: the derived model is version 2's too."""
    path = save_conv_net(tmp_path / "m.onnx", seed=78)
    npz = tmp_path / "samples.npz"
    np.savez(npz, input=np.random.default_rng(78).standard_normal((8, 3, 32, 32)).astype(np.float32))
    spec = {**sample_spec(), "precision": "int8"}
    name = unique_name("reuse-version")
    with Client(farm.url) as c:
        builds = {}
        for version in ("v1", "v2"):
            model, created = c.upload(path, name, version=version)
            assert created and model["version"] == version
            c.upload_samples(model["id"], npz)
            builds[version] = c.wait_build(c.build(model["id"], [GPU], spec)["id"], timeout=300, poll=0.2)
            assert [t["state"] for t in builds[version]["tasks"]] == ["succeeded"], builds[version]
        engine_id = builds["v1"]["tasks"][0]["engine_id"]
        assert builds["v2"]["tasks"][0]["engine_id"] == engine_id  # reused, not built again
        trt_rtx = c.engines(model=name)["items"][0]["trt_version"]
        machine = Machine(compute_capability="8.6", platform="x86_64", trt_rtx_version=trt_rtx)
        for version in ("v1", "v2"):
            try:
                answer = c.resolve(name, machine, version=version, precision="int8")  # unchecked: no GPU here
            except NoCompatibleEngine as exc:
                raise AssertionError(f"{version}: {exc} {exc.problems}") from exc
            assert answer["engine"]["id"] == engine_id, (version, answer)
            assert answer["engine"]["precision"] == "int8"
        assert builds["v2"]["quantize"]["derived_version"].startswith("v2-"), builds["v2"]["quantize"]
