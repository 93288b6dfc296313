"""Version-correct retrieval end to end: real PostgreSQL, Redis, SeaweedFS, uvicorn and two Celery workers.

One model is built for tensorrt-rtx sm80, sm86 and sm89 plus an ONNX Runtime CPU artifact. Machines of
each kind then ask which engine runs on them; the answers, the fallbacks and every rejection's rule are
checked, and a second fetch must come from the local cache without a download.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import asdict, replace

import httpx
import pytest

from enginefarm.client import ApiError, Client, resolve_offline
from enginefarm.client.cache import EngineCache
from enginefarm.core.errors import NoCompatibleEngine
from enginefarm.core.machine import Machine
from enginefarm.graph.samples import sample_spec, save_conv_net
from storage import checks
from storage.db import session_scope
from storage.tables import BenchmarkRow, EngineRow
from tests.helpers import run_cli, unique_name

TARGETS = ["tensorrt-rtx/sm80", "tensorrt-rtx/sm86", "tensorrt-rtx/sm89", "onnxruntime/cpu-x86_64"]
GPU_TARGETS = TARGETS[:3]


@pytest.fixture(scope="module")
def built(farm, tmp_path_factory):
    """(model name, engines by target, the TensorRT-RTX release the workers run)."""
    path = save_conv_net(tmp_path_factory.mktemp("resolve") / "m.onnx", seed=21)
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("resolve"))
        done = c.wait_build(c.build(model["id"], TARGETS, sample_spec())["id"], timeout=300, poll=0.2)
        assert {t["state"] for t in done["tasks"]} == {"succeeded"}, done
        engines = {e["target"]: e for e in c.engines(model=model["name"])["items"]}
    return model["name"], engines, engines["tensorrt-rtx/sm86"]["backend_version"]


def rtx_machine(rtx: str, **kw) -> Machine:
    base = Machine(
        gpu_name="NVIDIA GeForce RTX 3090",
        compute_capability="8.6",
        memory_mib=24576,
        driver_version="580.82.07",
        cuda_version="13.0",
        trt_rtx_version=rtx,
        platform="x86_64",
        os="Linux 6.8 (Ubuntu 24.04 LTS)",
    )
    return replace(base, **kw)


# (what, machine overrides, chosen target, match, {target: rule} for rejections)
KINDS = [
    (
        "A100, sm80",
        dict(gpu_name="NVIDIA A100-SXM4-80GB", compute_capability="8.0", memory_mib=81920),
        "tensorrt-rtx/sm80",
        "exact_cc",
        {"tensorrt-rtx/sm86": "rtx-cc", "tensorrt-rtx/sm89": "rtx-cc"},
    ),
    (
        "RTX 3090, sm86",
        {},
        "tensorrt-rtx/sm86",
        "exact_cc",
        {"tensorrt-rtx/sm80": "rtx-cc", "tensorrt-rtx/sm89": "rtx-cc"},
    ),
    (
        "RTX 4090, sm89",
        dict(gpu_name="NVIDIA GeForce RTX 4090", compute_capability="8.9"),
        "tensorrt-rtx/sm89",
        "exact_cc",
        {"tensorrt-rtx/sm80": "rtx-cc", "tensorrt-rtx/sm86": "rtx-cc"},
    ),
    (
        "T4, sm75: only the CPU artifact",
        dict(gpu_name="Tesla T4", compute_capability="7.5", memory_mib=15360),
        "onnxruntime/cpu-x86_64",
        "cpu_fallback",
        {t: "rtx-cc" for t in GPU_TARGETS},
    ),
    (
        "H100, sm90: TensorRT-RTX does not run on Hopper",
        dict(gpu_name="NVIDIA H100 80GB HBM3", compute_capability="9.0"),
        "onnxruntime/cpu-x86_64",
        "cpu_fallback",
        {t: "rtx-cc" for t in GPU_TARGETS},
    ),
    (
        "RTX 3090 on driver 570: below CUDA 13's floor",
        dict(driver_version="570.172.08"),
        "onnxruntime/cpu-x86_64",
        "cpu_fallback",
        {"tensorrt-rtx/sm86": "driver-floor", "tensorrt-rtx/sm80": "rtx-cc", "tensorrt-rtx/sm89": "rtx-cc"},
    ),
    (
        "RTX 3090 on another TensorRT-RTX release",
        dict(trt_rtx_version="1.6.0.45"),
        "onnxruntime/cpu-x86_64",
        "cpu_fallback",
        {t: "rtx-release" for t in GPU_TARGETS},
    ),
    (
        "RTX 3090 with only full TensorRT",
        dict(trt_rtx_version=None, trt_version="10.13.3.9"),
        "onnxruntime/cpu-x86_64",
        "cpu_fallback",
        {t: "runtime" for t in GPU_TARGETS},
    ),
    (
        "no GPU",
        dict(gpu_name=None, compute_capability=None, memory_mib=None, driver_version=None, cuda_version=None),
        "onnxruntime/cpu-x86_64",
        "cpu_fallback",
        {t: "rtx-cc" for t in GPU_TARGETS},
    ),
]


@pytest.mark.parametrize("what, overrides, target, match, rejected", KINDS, ids=[k[0] for k in KINDS])
def test_each_kind_of_machine_gets_the_engine_that_runs_there(farm, built, what, overrides, target, match, rejected):
    name, engines, rtx = built
    machine = rtx_machine(rtx, **overrides)
    # A GPU machine that names its runtime gets the CPU artifact only when it says it accepts one.
    accept = ["cpu"] if match == "cpu_fallback" and machine.gpu_runtimes else None
    with Client(farm.url) as c:
        answer = c.resolve(name, machine, explain=True, accept=accept)
        small = c.resolve(name, machine, accept=accept)
        if accept:
            with pytest.raises(ApiError) as unasked:
                c.resolve(name, machine)
            assert unasked.value.status_code == 404
            cpu = next(p for p in unasked.value.problems if p["target"] == "onnxruntime/cpu-x86_64")
            assert cpu["rule"] == "named-runtime"
    assert answer["engine"]["target"] == target, answer["reason"]
    assert answer["engine"]["id"] == engines[target]["id"]
    assert answer["match"] == match
    assert answer["download_url"] == f"/v1/engines/{engines[target]['id']}/content"
    if machine.gpu_runtimes and not accept:  # a GPU engine runs here: the CPU file was not asked for
        rejected = rejected | {"onnxruntime/cpu-x86_64": "named-runtime"}
    got = {r["target"]: r["rule"] for r in answer["rejected"]}
    assert got == rejected, answer["rejected"]
    # Every candidate is accounted for: the choice, the ranked fallbacks, the rejections.
    assert 1 + len(answer["fallbacks"]) + len(answer["rejected"]) == len(TARGETS)
    assert [f["rank"] for f in answer["fallbacks"]] == list(range(2, 2 + len(answer["fallbacks"])))
    # Without explain the answer is the choice, the fallbacks and a count of exclusions per rule.
    assert small["rejected"] is None and small["candidates"] is None
    assert small["excluded"] == dict(Counter(rejected.values())) == answer["excluded"]
    assert small["engine"] == answer["engine"] and small["fallbacks"] == [
        {**f, "checks": None} for f in answer["fallbacks"]
    ]


def test_jetson_gets_404_with_every_reason(farm, built):
    name, _, _ = built
    jetson = Machine(
        gpu_name="Orin",
        compute_capability="8.7",
        memory_mib=62841,
        driver_version="540.4.0",
        cuda_version="12.6",
        trt_version="10.3.0.30",
        platform="aarch64",
        jetpack="6.2",
    )
    with Client(farm.url) as c, pytest.raises(ApiError) as info:
        c.resolve(name, jetson)
    assert info.value.status_code == 404
    assert f"none of the {len(TARGETS)} engines of {name} runs" in info.value.message
    problems = {p["target"]: p for p in info.value.problems}
    assert set(problems) == set(TARGETS)
    assert {p["rule"] for p in problems.values()} == {"platform"}
    assert problems["tensorrt-rtx/sm86"]["reason"] == "built for x86_64, you run aarch64"


def test_get_and_post_agree_and_explain_lists_every_check(farm, api, built):
    name, engines, rtx = built
    machine = rtx_machine(rtx)
    params = {
        "model": name,
        "cc": "8.6",
        "gpu": machine.gpu_name,
        "memory_mib": 24576,
        "driver": machine.driver_version,
        "cuda": "13.0",
        "trt_rtx": rtx,
        "platform": "x86_64",
        "os": machine.os,
        "explain": "true",
    }
    got = api.get("/v1/resolve", params=params)
    posted = api.post("/v1/resolve", json={"model": name, "machine": asdict(machine), "explain": True})
    assert got.status_code == posted.status_code == 200
    a, b = got.json(), posted.json()
    assert a["engine"]["id"] == b["engine"]["id"] == engines["tensorrt-rtx/sm86"]["id"]
    assert [c["engine_id"] for c in a["candidates"]] == [c["engine_id"] for c in b["candidates"]]
    table = {c["target"]: c for c in b["candidates"]}
    assert set(table) == set(TARGETS)
    assert table["tensorrt-rtx/sm86"]["rank"] == 1 and table["onnxruntime/cpu-x86_64"]["rank"] is None
    assert table["onnxruntime/cpu-x86_64"]["rule"] == "named-runtime"  # a TensorRT-RTX machine did not ask for it
    assert table["tensorrt-rtx/sm89"]["rank"] is None
    rules = {c["rule"]: c["outcome"] for c in table["tensorrt-rtx/sm86"]["checks"]}
    assert rules == {
        "platform": "pass",
        "rtx-release": "pass",
        "rtx-cc": "pass",
        "driver-floor": "pass",
        "memory": "pass",
        "accuracy-gate": "unchecked",
    }  # no GPU worker has checked it: served, and said to be unchecked
    assert b["accuracy"] == "unchecked" and "accuracy-gate" in b["unchecked"]
    sm89 = {c["rule"]: c for c in table["tensorrt-rtx/sm89"]["checks"]}
    assert (
        sm89["rtx-cc"]["outcome"] == "fail"
        and "built for compute capability 8.9, you have 8.6" in sm89["rtx-cc"]["detail"]
    )
    # Without explain the table is left out; the machine is echoed back as understood.
    plain = api.post("/v1/resolve", json={"model": name, "machine": asdict(machine)}).json()
    assert plain["candidates"] is None and plain["machine"]["trt_rtx_version"] == rtx


def test_fingerprint_errors_are_4xx_that_name_the_field(api, built):
    name, _, _ = built
    bad = api.post("/v1/resolve", json={"model": name, "machine": {"compute_capability": "eight", "gpu": "x"}})
    assert bad.status_code == 422
    text = bad.text
    assert "compute_capability" in text and "gpu" in text  # a bad value and an unknown field, both named
    assert api.get("/v1/resolve", params={"model": name, "platform": "ppc64le"}).status_code == 422
    assert api.get("/v1/resolve", params={"model": name, "max_latency_ms": "-1"}).status_code == 422
    assert api.post("/v1/resolve", json={"model": "no-such-model"}).status_code == 404


def test_filters_and_measured_evidence_rank_and_exclude(farm, api, built, dist_settings):
    name, engines, rtx = built
    base = {"model": name, "machine": asdict(rtx_machine(rtx))}
    fp16 = api.post("/v1/resolve", json=base | {"precision": "fp16"})
    assert fp16.status_code == 404
    assert {p["rule"] for p in fp16.json()["problems"]} == {"filter:precision"}
    # The benchmark stage checks the CPU artifact here; the GPU engines wait for a GPU worker, unchecked.
    with Client(farm.url) as c:
        c.wait_checks(engines["onnxruntime/cpu-x86_64"]["model_id"], timeout=120)
    gpu_only = api.post("/v1/resolve", json=base | {"accuracy": "pass", "explain": True})
    assert gpu_only.status_code == 404  # a TensorRT-RTX machine is never handed the ONNX Runtime file unasked
    cpu_rule = next(p for p in gpu_only.json()["problems"] if p["target"] == "onnxruntime/cpu-x86_64")
    assert cpu_rule["rule"] == "named-runtime" and "accept=cpu" in cpu_rule["reason"]
    assert "tensorrt-rtx/sm86" in gpu_only.json()["build"]["targets"]
    assert gpu_only.json()["build"]["command"].startswith(f"enginefarm fetch {name} ")
    unchecked = api.post("/v1/resolve", json=base | {"accuracy": "pass", "explain": True, "accept": ["cpu"]}).json()
    assert unchecked["engine"]["target"] == "onnxruntime/cpu-x86_64" and unchecked["match"] == "cpu_fallback"
    rejected = {r["target"]: r for r in unchecked["rejected"]}
    assert rejected["tensorrt-rtx/sm86"]["rule"] == "filter:accuracy"
    assert "has no accuracy result yet" in rejected["tensorrt-rtx/sm86"]["reason"]

    # Evidence as the benchmark stage records it: accuracy on the engine, latency per GPU model and shape.
    sm86 = engines["tensorrt-rtx/sm86"]["id"]
    with session_scope(dist_settings) as s:
        project = s.get(EngineRow, sm86).model.project
        checks.record_verdict(s, sm86, project, {"pass": True})
        s.add(
            BenchmarkRow(
                engine_id=sm86,
                project=project,
                shape_key="opt",
                gpu_name="NVIDIA GeForce RTX 3090",
                compute_capability="8.6",
                median_ms=1.25,
                p99_ms=1.5,
                machine={},
                stats={},
                shapes={},
            )
        )
        s.add(
            BenchmarkRow(
                engine_id=sm86,
                project=project,
                shape_key="opt",
                gpu_name="NVIDIA RTX A6000",
                compute_capability="8.6",
                median_ms=0.5,
                machine={},
                stats={},
                shapes={},
            )
        )
    passed = api.post("/v1/resolve", json=base | {"accuracy": "pass", "max_latency_ms": 2, "explain": True}).json()
    assert passed["engine"]["id"] == sm86
    row = next(c for c in passed["candidates"] if c["engine_id"] == sm86)
    assert (row["accuracy"], row["latency_ms"], row["latency_on"]) == ("pass", 1.25, "NVIDIA GeForce RTX 3090")
    too_slow = api.post("/v1/resolve", json=base | {"max_latency_ms": 1})
    assert too_slow.status_code == 404
    assert "median latency 1.25 ms on NVIDIA GeForce RTX 3090 exceeds your maximum 1 ms" in too_slow.text
    # On an A6000 (same cc) the A6000 measurement is the one that counts.
    a6000 = api.post(
        "/v1/resolve",
        json=base | {"machine": asdict(rtx_machine(rtx, gpu_name="NVIDIA RTX A6000")), "max_latency_ms": 1},
    ).json()
    assert a6000["engine"]["id"] == sm86


def test_fetch_twice_second_from_cache_then_offline(farm, built, tmp_path):
    name, engines, rtx = built
    cache = EngineCache(tmp_path / "cache")
    downloads = []
    hook = {"request": [lambda r: downloads.append(r.url.path) if r.url.path.endswith("/content") else None]}
    machine = rtx_machine(rtx, gpu_name="NVIDIA GeForce RTX 4090", compute_capability="8.9")
    with Client(farm.url) as c:
        c.http = httpx.Client(base_url=farm.url, timeout=60, event_hooks=hook, headers=farm.headers)
        first = c.fetch(name, tmp_path / "a.plan", machine, cache=cache)
        second = c.fetch(name, tmp_path / "b.plan", machine, cache=cache)
    sm89 = engines["tensorrt-rtx/sm89"]
    assert not first.from_cache and second.from_cache
    assert downloads == [f"/v1/engines/{sm89['id']}/content"]  # one download for two fetches
    for p in (tmp_path / "a.plan", tmp_path / "b.plan"):
        assert hashlib.sha256(p.read_bytes()).hexdigest() == sm89["sha256"]
    assert not list(tmp_path.glob(".*"))  # no temp file left beside the outputs

    # Offline: the same rules over what the cache holds, with no farm at all.
    offline = resolve_offline(cache, name, machine)
    assert offline["engine"]["id"] == sm89["id"] and offline["match"] == "exact_cc"
    with pytest.raises(NoCompatibleEngine) as info:
        resolve_offline(cache, name, replace(machine, compute_capability="8.6"))
    assert "built for compute capability 8.9, you have 8.6" in info.value.problems[0]["reason"]

    # A corrupted cache entry is noticed and downloaded again, never copied out.
    blob = cache.path(sm89["sha256"])
    blob.write_bytes(b"\0" + blob.read_bytes()[1:])
    with Client(farm.url) as c:
        third = c.fetch(name, tmp_path / "c.plan", machine, cache=cache)
    assert not third.from_cache
    assert hashlib.sha256((tmp_path / "c.plan").read_bytes()).hexdigest() == sm89["sha256"]


def test_cli_fetch_explain_cache_and_offline(farm, built, tmp_path):
    name, engines, rtx = built
    cache = tmp_path / "cache"
    flags = [
        "--cc",
        "8.0",
        "--gpu",
        "NVIDIA A100-SXM4-80GB",
        "--trt-rtx",
        rtx,
        "--driver",
        "580.82.07",
        "--platform",
        "x86_64",
    ]
    explained = run_cli(farm.url, "fetch", name, *flags, "--explain", cache_dir=cache)
    assert "tensorrt-rtx/sm80" in explained and "exact_cc" in explained and "rtx-cc" in explained
    assert "TensorRT-RTX engine built for compute capability 8.6, you have 8.0" in explained
    assert f"as the machine: x86_64, NVIDIA A100-SXM4-80GB, cc 8.0, TensorRT-RTX {rtx}," in explained
    assert "not downloaded" in explained and "verified" not in explained  # nothing was fetched, nothing verified
    out = tmp_path / "engine.plan"
    first = run_cli(farm.url, "fetch", name, "-o", str(out), *flags, "--explain", cache_dir=cache)
    second = run_cli(farm.url, "fetch", name, "-o", str(out), *flags, cache_dir=cache)
    assert "downloaded" in first and "rtx-cc" in first  # the table and the download in one go
    assert "from the local cache" in second and "rtx-cc" not in second
    assert hashlib.sha256(out.read_bytes()).hexdigest() == engines["tensorrt-rtx/sm80"]["sha256"]
    offline = run_cli(
        "http://127.0.0.1:9", "fetch", name, "-o", str(tmp_path / "off.plan"), *flags, "--offline", cache_dir=cache
    )
    assert "tensorrt-rtx/sm80" in offline and "from the local cache" in offline
    failed = run_cli(
        farm.url,
        "fetch",
        name,
        "-o",
        str(tmp_path / "x"),
        *flags,
        "--offline",
        "--cc",
        "8.9",
        cache_dir=cache,
        expect=1,
    )
    assert "none of the 1 cached engines" in failed


def test_build_for_the_asking_machine(farm, api, built, tmp_path):
    name, _, rtx = built
    # An RTX 5090 (sm120): only the CPU artifact runs, so build=true builds tensorrt-rtx/sm120 (worker B serves it).
    blackwell = asdict(rtx_machine(rtx, gpu_name="NVIDIA GeForce RTX 5090", compute_capability="12.0"))
    plain = api.post("/v1/resolve", json={"model": name, "machine": blackwell})
    assert plain.status_code == 404  # no TensorRT-RTX engine for sm120 yet, and the CPU file was not asked for
    assert plain.json()["build"]["targets"] == ["tensorrt-rtx/sm120"]
    assert "--cc 12.0" in plain.json()["build"]["command"] and plain.json()["build"]["command"].endswith("--build")
    assert (
        api.post("/v1/resolve", json={"model": name, "machine": blackwell, "accept": ["cpu"]}).json()["match"]
        == "cpu_fallback"
    )
    r = api.post("/v1/resolve", json={"model": name, "machine": blackwell, "build": True, "accept": ["cpu"]})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["target"] == "tensorrt-rtx/sm120" and body["fallback"]["target"] == "onnxruntime/cpu-x86_64"
    assert {p["rule"] for p in body["reasons"]} == {"rtx-cc"}
    with Client(farm.url) as c:
        c.wait_build(body["build_id"], timeout=120, poll=0.2)
        after = c.resolve(name, Machine(**blackwell))
    assert after["engine"]["target"] == "tensorrt-rtx/sm120" and after["match"] == "exact_cc"

    # A T4 (sm75): TensorRT-RTX cannot build this fp32 model's MatMul for Turing, so the build it gets is fp16,
    # and says why (it waits: no live worker serves sm75).
    turing = asdict(rtx_machine(rtx, gpu_name="Tesla T4", compute_capability="7.5"))
    queued = api.post("/v1/resolve", json={"model": name, "machine": turing, "build": True})
    assert queued.status_code == 202, queued.text
    (task,) = api.get(f"/v1/builds/{queued.json()['build_id']}").json()["tasks"]
    assert task["target"] == "tensorrt-rtx/sm75" and task["precision"] == "fp16"
    assert "FP32 GEMM is not supported" in task["precision_note"]
    # A GB10 (sm121): no live worker serves tensorrt-rtx/sm121; the build waits and says so, and asking again
    # finds the same build instead of queuing another.
    spark = asdict(rtx_machine(rtx, gpu_name="NVIDIA GB10", compute_capability="12.1"))
    first = api.post("/v1/resolve", json={"model": name, "machine": spark, "build": True}).json()
    again = api.post("/v1/resolve", json={"model": name, "machine": spark, "build": True}).json()
    assert (
        first["target"] == "tensorrt-rtx/sm121" and "no live worker serves tensorrt-rtx/sm121" in first["status_detail"]
    )
    assert again["build_id"] == first["build_id"] and again["already_building"] and not first["already_building"]

    # Another TensorRT-RTX release than the workers': building now would not help, so say why instead.
    old = asdict(rtx_machine(rtx, trt_rtx_version="1.6.0.45"))
    refused = api.post("/v1/resolve", json={"model": name, "machine": old, "build": True})
    assert refused.status_code == 409
    assert f"live workers build tensorrt-rtx/sm86 with tensorrt-rtx {rtx}; you run 1.6.0.45" in refused.json()["detail"]


def test_cli_fetch_build_wait(farm, tmp_path):
    """`fetch --build --wait` on a machine nothing fits yet: it builds, waits, then downloads the engine."""
    path = save_conv_net(tmp_path / "m.onnx", seed=22)
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("fetchbuild"))
        source = c.build(model["id"], ["tensorrt-rtx/sm80"], sample_spec())
        c.wait_build(source["id"], timeout=120, poll=0.2)
        rtx = c.engines(model=model["name"])["items"][0]["backend_version"]
    out = tmp_path / "sm89.plan"
    flags = ["--cc", "8.9", "--trt-rtx", rtx, "--platform", "x86_64", "--driver", "580.82.07"]
    nothing = run_cli(farm.url, "fetch", model["name"], "-o", str(out), *flags, cache_dir=tmp_path / "c", expect=1)
    assert "you have 8.9" in nothing
    done = run_cli(
        farm.url,
        "fetch",
        model["name"],
        "-o",
        str(out),
        *flags,
        "--build",
        "--wait",
        "--timeout",
        "120",
        cache_dir=tmp_path / "c",
    )
    assert "built for this machine" in done and "tensorrt-rtx/sm89" in done
    # It says what it built and whose spec that was, so a build of something else than meant is seen at once.
    assert f"{sample_spec().get('precision', 'fp32')}, from build {source['id']}'s spec" in done, done
    with Client(farm.url) as c:
        sm89 = next(e for e in c.engines(model=model["name"])["items"] if e["target"] == "tensorrt-rtx/sm89")
    assert hashlib.sha256(out.read_bytes()).hexdigest() == sm89["sha256"]


def test_export_triton_repository(farm, built, tmp_path):
    """`enginefarm export triton`: one plan per compute capability, the ONNX CPU fallback, a config Triton parses."""
    from google.protobuf import text_format

    from tests.triton_model_config import ModelConfig, ModelInstanceGroup

    name, _, _ = built
    out = tmp_path / "repo"
    printed = run_cli(farm.url, "export", "triton", name, "--out", str(out), cache_dir=tmp_path / "cache", stderr=True)
    assert "Triton's stock TensorRT backend" in printed  # the TensorRT-RTX warning is said, not hidden
    safe = name  # catalog names are already safe Triton names
    cfg = text_format.Parse((out / safe / "config.pbtxt").read_text(), ModelConfig())
    assert cfg.platform == "tensorrt_plan" and cfg.name == safe
    with Client(farm.url) as c:  # every GPU engine built so far (another test may have added sm120)
        gpu = {e["compute_capability"]: e for e in c.engines(model=name)["items"] if e["compute_capability"]}
    assert {"8.0", "8.6", "8.9"} <= set(gpu)
    assert dict(cfg.cc_model_filenames) == {cc: f"model_sm{cc.replace('.', '')}.plan" for cc in gpu}
    for cc, filename in cfg.cc_model_filenames.items():
        assert hashlib.sha256((out / safe / "1" / filename).read_bytes()).hexdigest() == gpu[cc]["sha256"]
    # sample_spec's profile: batch 1..8 (opt 4) on a dynamic batch axis; the batch axis leaves the dims.
    assert cfg.max_batch_size == 8 and list(cfg.dynamic_batching.preferred_batch_size) == [4]
    assert [(t.name, list(t.dims)) for t in cfg.input] == [("input", [3, 32, 32])]
    assert [(t.name, list(t.dims)) for t in cfg.output] == [("logits", [10])]
    assert cfg.instance_group[0].kind == ModelInstanceGroup.Kind.Value("KIND_GPU")
    cpu = text_format.Parse((out / f"{safe}_onnx" / "config.pbtxt").read_text(), ModelConfig())
    assert cpu.platform == "onnxruntime_onnx" and cpu.instance_group[0].kind == ModelInstanceGroup.Kind.Value(
        "KIND_CPU"
    )
    with Client(farm.url) as c:
        model = c.models(name=name)["items"][0]
    assert hashlib.sha256((out / f"{safe}_onnx" / "1" / "model.onnx").read_bytes()).hexdigest() == model["sha256"]
    # A second export into the same place is refused unless asked to overwrite.
    refused = run_cli(farm.url, "export", "triton", name, "--out", str(out), cache_dir=tmp_path / "cache", expect=1)
    assert "overwrite" in refused
    run_cli(farm.url, "export", "triton", name, "--out", str(out), "--overwrite", cache_dir=tmp_path / "cache")


def test_same_bytes_under_another_name_share_engines(farm, api, built, tmp_path):
    """An engine belongs to the model's bytes: the same file uploaded under a second name lists and
    resolves to the engines already built, and its identical build is answered from the catalog."""
    name, engines, rtx = built
    path = save_conv_net(tmp_path / "m.onnx", seed=21)  # the very bytes `built` uploaded
    with Client(farm.url) as c:
        twin, created = c.upload(path, unique_name("twin"))
        assert created and twin["sha256"] == c.models(name=name)["items"][0]["sha256"]
        build = c.wait_build(c.build(twin["id"], ["tensorrt-rtx/sm86"], sample_spec())["id"], timeout=60, poll=0.2)
        assert build["tasks"][0]["reused"] and build["tasks"][0]["engine_id"] == engines["tensorrt-rtx/sm86"]["id"]
        listed = c.engines(model=twin["name"])["items"]
        answer = c.resolve(twin["name"], rtx_machine(rtx))
    assert {e["target"] for e in listed} >= set(TARGETS)
    assert {e["model_name"] for e in listed} == {twin["name"]}
    assert (
        answer["engine"]["id"] == engines["tensorrt-rtx/sm86"]["id"] and answer["engine"]["model_name"] == twin["name"]
    )


def test_a_machine_asking_again_gets_a_304_and_keeps_its_answer(farm, built, tmp_path):
    """With a cache, the client keeps the farm's answer and asks again with If-None-Match: the farm answers 304 and
    the kept answer stands. Another question, or another cache, is asked in full."""
    name, engines, rtx = built
    statuses: list[int] = []
    cache = EngineCache(tmp_path / "cache")
    with Client(farm.url) as c:
        c.http.event_hooks["response"].append(
            lambda r: statuses.append(r.status_code) if r.request.url.path == "/v1/resolve" else None
        )
        first = c.resolve(name, rtx_machine(rtx), cache=cache)
        again = c.resolve(name, rtx_machine(rtx), cache=cache)
        other = c.resolve(name, rtx_machine(rtx, compute_capability="8.9"), cache=cache)
        fetched = c.fetch(name, tmp_path / "e.plan", rtx_machine(rtx), cache=cache)
        fresh = c.resolve(name, rtx_machine(rtx), cache=EngineCache(tmp_path / "other"))
    assert statuses == [200, 304, 200, 304, 200], statuses
    assert again == first == fresh and fetched.answer == first
    assert other["engine"]["id"] == engines["tensorrt-rtx/sm89"]["id"]
    assert hashlib.sha256((tmp_path / "e.plan").read_bytes()).hexdigest() == first["engine"]["sha256"]


def test_client_detects_its_own_machine(farm, built):
    """With no fingerprint given, the client describes the machine it runs on: here, no GPU, x86_64,
    TensorRT-RTX importable. The CPU artifact is the answer and every GPU engine says why not."""
    name, engines, rtx = built
    with Client(farm.url) as c:
        answer = c.resolve(name, explain=True)
    assert answer["machine"]["platform"] == "x86_64" and answer["machine"]["trt_rtx_version"] == rtx
    assert answer["machine"]["compute_capability"] is None
    assert answer["engine"]["id"] == engines["onnxruntime/cpu-x86_64"]["id"]
    assert {r["rule"] for r in answer["rejected"]} == {"rtx-cc"}


def test_get_names_onnxruntime_cuda_and_hears_what_would_fit(api, built):
    """GET takes the ONNX Runtime fields POST takes: a Hopper machine that runs ONNX Runtime with CUDA, for a
    model with no CUDA artifact yet, is told that onnxruntime/cuda-sm90 would fit, and not handed the CPU file."""
    name, _, _ = built
    r = api.get(
        "/v1/resolve",
        params={
            "model": name,
            "cc": "9.0",
            "gpu": "NVIDIA H100 80GB HBM3",
            "platform": "x86_64",
            "ort": "1.31.1",
            "ort_cuda": "true",
        },
    )
    assert r.status_code == 404, r.text
    assert r.json()["build"]["targets"] == ["onnxruntime/cuda-sm90"]
    cpu = next(p for p in r.json()["problems"] if p["target"] == "onnxruntime/cpu-x86_64")
    assert cpu["rule"] == "named-runtime" and "ONNX Runtime CUDA" in cpu["reason"]
