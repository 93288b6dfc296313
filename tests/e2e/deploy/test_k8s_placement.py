"""deploy/k8s worker groups: where each may be scheduled among realistic GPU Feature Discovery-labelled nodes, that
what it builds and benchmarks runs on those nodes, and that KEDA scales it on the Redis lists Celery really
writes for its queues."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import redis

from enginefarm.core.config import Settings
from enginefarm.core.domain import RTX_PORTABLE_CCS, Backend, Target, all_targets
from server.embedded import free_port
from storage.queue import BUILD_TASK, make_celery
from tests.deploy import manifests as m
from tests.deploy.placement import GPU, GPU_TAINT, NODES, Node, fits, tolerates, why_not

# Where each worker group may land, by node name (tests/deploy/placement.py).
EXPECTED = {
    "enginefarm-worker-tensorrt-sm90": {"hgx-h100"},
    "enginefarm-worker-tensorrt-sm80": {"dgx-a100"},
    "enginefarm-worker-tensorrt-sm86": {"g5-a10g"},
    "enginefarm-worker-tensorrt-sm89": {"g2-l4", "ws-rtx4090"},
    "enginefarm-worker-jetson-orin": {"agx-orin"},
    "enginefarm-worker-rtx-build": {"cpu-amd64"},
    "enginefarm-worker-onnxruntime-x86-64": {"cpu-amd64"},
    "enginefarm-worker-onnxruntime-aarch64": {"cpu-arm64"},
}
ARCH_OF_PLATFORM = {"cpu-x86_64": "amd64", "cpu-aarch64": "arm64"}


def landing(spec: dict) -> set[str]:
    return {name for name, node in NODES.items() if fits(spec, node)}


def test_matcher_judges_operators_taints_and_gpus_as_the_scheduler_does():
    node = Node("n", {"a": "1", "b": "x"}, (GPU_TAINT,), {GPU: 1})

    def term(*exprs):
        required = {"nodeSelectorTerms": [{"matchExpressions": list(exprs)}]}
        return {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
            "tolerations": [{"operator": "Exists"}],
        }

    assert fits(term({"key": "c", "operator": "NotIn", "values": ["1"]}), node)  # absent label: NotIn holds
    assert not fits(term({"key": "a", "operator": "Gt", "values": ["1"]}), node)
    assert fits(term({"key": "a", "operator": "Lt", "values": ["2"]}), node)
    assert not fits(term({"key": "c", "operator": "Lt", "values": ["2"]}), node)  # absent label: Lt fails
    assert not fits(term({"key": "b", "operator": "Exists"}, {"key": "a", "operator": "DoesNotExist"}), node)
    assert fits(term({"key": "b", "operator": "In", "values": ["y", "x"]}), node)
    either = term({"key": "a", "operator": "In", "values": ["9"]})
    either["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].append(
        {"matchExpressions": [{"key": "b", "operator": "Exists"}]}
    )
    assert fits(either, node)  # terms are ORed
    assert why_not({"nodeSelector": {"a": "2"}, "tolerations": [{"operator": "Exists"}]}, node) == "nodeSelector a=2"
    assert why_not({}, node) == "untolerated taint nvidia.com/gpu:NoSchedule"
    assert tolerates([{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}], GPU_TAINT)
    assert not tolerates([{"key": GPU, "operator": "Equal", "value": "other"}], GPU_TAINT)
    wants_two = {"tolerations": [{"operator": "Exists"}], "containers": [{"resources": {"limits": {GPU: "2"}}}]}
    assert why_not(wants_two, node) == f"insufficient {GPU}"


def test_node_fixtures_carry_gfd_labels_that_agree():
    family = {"8.0": "ampere", "8.6": "ampere", "8.7": "ampere", "8.9": "ada-lovelace", "9.0": "hopper"}
    for node in NODES.values():
        labels = node.labels
        if "nvidia.com/gpu.product" in labels:
            cc = f"{labels['nvidia.com/gpu.compute.major']}.{labels['nvidia.com/gpu.compute.minor']}"
            assert labels["nvidia.com/gpu.family"] == family[cc]
            assert node.allocatable[GPU] == int(labels["nvidia.com/gpu.count"]) * int(labels["nvidia.com/gpu.replicas"])


def test_every_worker_group_is_placed_where_expected():
    groups = m.worker_groups()
    assert set(groups) == set(EXPECTED)
    for name, group in groups.items():
        assert landing(group.spec) == EXPECTED[name], name


def test_hopper_worker_lands_only_on_the_h100():
    group = m.worker_groups()["enginefarm-worker-tensorrt-sm90"]
    assert group.targets == (Target.parse("tensorrt/sm90"),)
    assert landing(group.spec) == {"hgx-h100"}
    assert why_not(group.spec, NODES["gh200"]) == "required node affinity"  # Hopper too, but arm64
    assert why_not(group.spec, NODES["dgx-a100"]) == "required node affinity"


def test_rtx_builders_ask_for_no_gpu_and_stay_off_gpu_nodes():
    group = m.worker_groups()["enginefarm-worker-rtx-build"]
    assert {t.backend for t in group.targets} == {Backend.TENSORRT_RTX} and not group.bench
    assert group.gpus == 0 and not group.spec.get("tolerations")
    assert {t for t in all_targets() if t.backend is Backend.TENSORRT_RTX} == set(group.targets)
    # Not even on an untainted GPU workstation: the affinity keeps them off, not only the taint.
    assert why_not(group.spec, NODES["ws-rtx4090"]) == "required node affinity"
    assert landing(group.spec) == {"cpu-amd64"}


def test_jetson_worker_lands_only_on_the_jetson():
    group = m.worker_groups()["enginefarm-worker-jetson-orin"]
    assert group.targets == (Target.parse("tensorrt/sm87"),)
    assert m.container(group.deployment)["image"].rsplit("/", 1)[-1].startswith("enginefarm-jetson:")
    assert landing(group.spec) == {"agx-orin"}
    # And nothing else lands there: the aarch64 CPU workers stay off the Jetson.
    others = [g for n, g in m.worker_groups().items() if n != group.name]
    assert not any(fits(g.spec, NODES["agx-orin"]) for g in others)


def test_gpu_workers_take_one_whole_gpu_and_tolerate_the_gpu_taint():
    for group in m.worker_groups().values():
        if any(t.is_gpu and t.backend is Backend.TENSORRT for t in group.targets):
            assert group.gpus == 1, group.name
            assert tolerates(group.spec["tolerations"], GPU_TAINT)
            assert not fits(group.spec, NODES["a100-shared"])  # a time-sliced GPU would skew its timings
        else:
            assert group.gpus == 0, group.name


def test_what_a_group_builds_and_benchmarks_runs_on_the_nodes_it_lands_on():
    for group in m.worker_groups().values():
        for node in (NODES[n] for n in landing(group.spec)):
            labels = node.labels
            cc = f"{labels.get('nvidia.com/gpu.compute.major')}.{labels.get('nvidia.com/gpu.compute.minor')}"
            for t in group.targets + group.bench:
                if t.backend is Backend.ONNXRUNTIME:
                    assert ARCH_OF_PLATFORM[t.arch] == labels["kubernetes.io/arch"], (group.name, t)
                elif t.backend is Backend.TENSORRT or t in group.bench:
                    # Full TensorRT builds for the GPU it runs on; a benchmark runs the engine on this GPU.
                    runs = t.compute_capability == cc or (t.arch == "portable" and cc in RTX_PORTABLE_CCS)
                    assert runs, (group.name, t, node.name)


def _scaled() -> dict[str, dict]:
    return {s["spec"]["scaleTargetRef"]["name"]: s for s in m.of_kind("ScaledObject")}


def test_every_scaled_object_targets_an_existing_worker_deployment():
    scaled = m.of_kind("ScaledObject")
    deployments = {d["metadata"]["name"] for d in m.of_kind("Deployment")}
    for s in scaled:
        ref = s["spec"]["scaleTargetRef"]
        assert ref["kind"] == "Deployment" and ref["apiVersion"] == "apps/v1" and ref["name"] in deployments
        assert ref["envSourceContainerName"] in {
            c["name"] for c in m.pod_spec(m.named("Deployment", ref["name"]))["containers"]
        }
    assert sorted(_scaled()) == sorted(m.worker_groups())  # one per worker group, none for anything else
    assert len(scaled) == len(_scaled())


def test_scaled_objects_scale_on_the_groups_real_queues():
    groups, scaled = m.worker_groups(), _scaled()
    covered = set()
    for name, group in groups.items():
        triggers = scaled[name]["spec"]["triggers"]
        lists = {t["metadata"]["listName"] for t in triggers}
        assert lists <= group.queues, (name, lists - group.queues)  # only queues this group consumes
        assert {t.queue for t in group.targets} <= lists, name  # its own builds always wake it
        covered |= lists
    # Every queue some worker consumes wakes some worker that consumes it (a group at zero wakes for it).
    assert set().union(*(g.queues for g in groups.values())) == covered


def test_rare_groups_scale_to_zero_and_common_ones_keep_a_worker():
    groups, scaled = m.worker_groups(), _scaled()
    for name, group in groups.items():
        spec = scaled[name]["spec"]
        rare = group.gpus > 0 or any(t.arch == "cpu-aarch64" for t in group.targets)
        assert spec["minReplicaCount"] == (0 if rare else 1), name
        assert spec["maxReplicaCount"] >= 1
        # KEDA owns the count: a replicas field would be reset by every `kubectl apply`.
        assert "replicas" not in group.deployment["spec"], name


def test_triggers_read_redis_as_the_workers_do():
    auths = {a["metadata"]["name"]: a for a in m.of_kind("TriggerAuthentication")}
    for name, s in _scaled().items():
        worker = m.container(m.named("Deployment", name))
        broker = m.env_value(worker, "ENGINEFARM_BROKER_URL")
        env_names = {e["name"] for e in worker["env"]}
        triggers = s["spec"]["triggers"]
        for t in triggers:
            assert t["type"] == "redis"
            meta = t["metadata"]
            assert meta["addressFromEnv"] in env_names and f"$({meta['addressFromEnv']})" in broker
            assert broker.endswith(f"/{meta['databaseIndex']}")  # the same Redis database as the broker URL
            auth = auths[t["authenticationRef"]["name"]]["spec"]["secretTargetRef"]
            password = next(e for e in worker["env"] if f"$({e['name']})" in broker.split("@")[0])
            ref = password["valueFrom"]["secretKeyRef"]
            assert {(a["parameter"], a["name"], a["key"]) for a in auth} == {("password", ref["name"], ref["key"])}
        # The replica count follows the sum of the group's queues: the formula names every trigger once.
        modifiers = s["spec"]["advanced"]["scalingModifiers"]
        assert sorted(re.split(r"\s*\+\s*", modifiers["formula"])) == sorted(t["name"] for t in triggers)
        assert modifiers["activationTarget"] == "0"  # one waiting task wakes a group at zero


@pytest.fixture
def private_redis(base_services, tmp_path):
    """A Redis of this test's own: no worker of the session consumes from it, so nothing takes a message away
    before its list is read."""
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def test_celery_queues_are_the_redis_lists_keda_reads(private_redis):
    """Publishes one task to every queue the ScaledObjects watch, through the farm's own Celery settings, and reads
    each list's length where KEDA will: the key named by listName, in the database the triggers name."""
    scaled = m.of_kind("ScaledObject")
    lists = sorted({t["metadata"]["listName"] for s in scaled for t in s["spec"]["triggers"]})
    (database,) = {t["metadata"]["databaseIndex"] for s in scaled for t in s["spec"]["triggers"]}
    app = make_celery(Settings(_env_file=None, broker_url=f"redis://127.0.0.1:{private_redis}/{database}"))
    try:
        for queue in lists:
            app.send_task(BUILD_TASK, args=[0], queue=queue)
    finally:
        app.close()
    client = redis.Redis(port=private_redis, db=int(database))
    assert {q: (client.type(q), client.llen(q)) for q in lists} == {q: (b"list", 1) for q in lists}
