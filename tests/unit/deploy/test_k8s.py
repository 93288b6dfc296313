"""deploy/k8s: every object valid for Kubernetes (strict) and KEDA, and what the farm needs of them: non-root
pods with probes and resources, secrets and settings that exist, worker grace periods that outlast a build, an
ingress that takes the largest upload, a network policy that lets in only the ingress and Prometheus."""

from __future__ import annotations

import base64
import re

import jsonschema
import kubernetes_validate
import pytest

from enginefarm.core.config import Settings
from tests.deploy import manifests as m
from tests.deploy.kustomize import Unsupported, render

# The oldest Kubernetes release the manifests are meant for, and the newest kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
WORKLOADS = ("Deployment", "Job")
NGINX_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def test_every_object_is_valid_for_kubernetes_in_strict_mode():
    builtin = [o for o in m.objects() if o["kind"] not in m.KEDA_KINDS]
    for version in KUBERNETES_VERSIONS:
        for obj in builtin:
            # Raises ValidationError (or SchemaNotFoundError for a kind or apiVersion that release lacks).
            kubernetes_validate.validate(obj, version, strict=True)
    kinds = {o["kind"] for o in builtin}
    assert {
        "Namespace",
        "ConfigMap",
        "Secret",
        "ServiceAccount",
        "Deployment",
        "Service",
        "Ingress",
        "Job",
        "PodDisruptionBudget",
        "NetworkPolicy",
    } <= kinds
    assert len(builtin) >= 30


def test_strict_validation_rejects_an_unknown_field():
    deployment = m.named("Deployment", "enginefarm-api")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def _keda_errors(obj: dict) -> list[str]:
    schema = m.strict(m.keda_schema(obj["kind"]))
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(obj)
    ]
    assert obj["apiVersion"] == "keda.sh/v1alpha1"
    spec = obj["spec"]
    if obj["kind"] == "ScaledObject" and spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
        errors.append("minReplicaCount must be less than or equal to maxReplicaCount")  # the CRD's CEL rule
    return errors


def test_keda_objects_are_valid_for_keda_crds():
    keda = [o for o in m.objects() if o["kind"] in m.KEDA_KINDS]
    assert {o["kind"] for o in keda} == set(m.KEDA_KINDS)
    for obj in keda:
        assert _keda_errors(obj) == [], obj["metadata"]["name"]


def test_keda_schema_rejects_what_keda_would():
    scaled = m.of_kind("ScaledObject")[0]
    scaled["spec"]["minReplicas"] = 0  # not a field: minReplicaCount is
    del scaled["spec"]["triggers"][0]["metadata"]
    scaled["spec"]["minReplicaCount"] = 9
    scaled["spec"]["maxReplicaCount"] = 3
    errors = "\n".join(_keda_errors(scaled))
    assert "minReplicas" in errors and "'metadata' is a required property" in errors
    assert "minReplicaCount must be less than or equal to maxReplicaCount" in errors


def test_renderer_refuses_what_it_cannot_render(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\npatches:\n  - path: p.yaml\n")
    with pytest.raises(Unsupported, match="patches"):
        render(tmp_path)


def test_namespace_images_and_labels_are_applied():
    for obj in m.objects():
        if obj["kind"] == "Namespace":
            assert obj["metadata"]["name"] == "enginefarm"
        else:
            assert obj["metadata"]["namespace"] == "enginefarm", obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "enginefarm"
    images = {c["image"] for o in m.objects() if o["kind"] in WORKLOADS for c in m.pod_spec(o)["containers"]}
    assert {i.rsplit("/", 1)[-1] for i in images} == {
        "enginefarm:0.1.0",
        "enginefarm-gpu:0.1.0",
        "enginefarm-jetson:0.1.0",
    }


def _pods():
    return [(o["metadata"]["name"], o) for o in m.objects() if o["kind"] in WORKLOADS]


@pytest.mark.parametrize("name,obj", _pods(), ids=[n for n, _ in _pods()])
def test_pods_run_as_non_root_with_a_read_only_root_and_resources(name, obj):
    spec = m.pod_spec(obj)
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
    assert spec["automountServiceAccountToken"] is False
    mounts_needed = {"/tmp", "/var/lib/enginefarm"}  # HOME and ENGINEFARM_DATA_DIR: the only places written
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        mounts = {v["mountPath"]: volumes[v["name"]] for v in c["volumeMounts"]}
        assert mounts_needed <= set(mounts) and all("emptyDir" in mounts[p] for p in mounts_needed)
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
        assert {"cpu", "memory"} <= set(c["resources"]["limits"]), c["name"]


@pytest.mark.parametrize("name,obj", _pods(), ids=[n for n, _ in _pods()])
def test_pods_have_probes_or_say_why_not(name, obj):
    why = obj["spec"]["template"]["metadata"].get("annotations", {}).get("enginefarm/probes", "")
    for c in m.pod_spec(obj)["containers"]:
        if why.startswith("none:"):
            assert len(why) > 40 and not {"livenessProbe", "readinessProbe"} & set(c)
        elif why.startswith("liveness only:"):
            assert "livenessProbe" in c and "readinessProbe" not in c and len(why) > 40
        else:
            assert "livenessProbe" in c and "readinessProbe" in c, f"{name}: probes, or enginefarm/probes saying why"


def test_api_probes_are_its_health_routes():
    api = m.container(m.named("Deployment", "enginefarm-api"))
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # /readyz gives each dependency 3 s: the probe must wait for its answer.
    assert api["readinessProbe"]["timeoutSeconds"] > 3


def test_every_referenced_secret_and_config_key_exists():
    data = {("Secret", o["metadata"]["name"]): set(o["data"]) for o in m.of_kind("Secret")}
    data.update({("ConfigMap", o["metadata"]["name"]): set(o["data"]) for o in m.of_kind("ConfigMap")})
    for _, obj in _pods():
        for c in m.pod_spec(obj)["containers"]:
            for source in c.get("envFrom", []):
                kind, ref = (
                    ("Secret", source["secretRef"]) if "secretRef" in source else ("ConfigMap", source["configMapRef"])
                )
                assert (kind, ref["name"]) in data
            defined = set()
            for e in c.get("env", []):
                for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                    if ref := e.get("valueFrom", {}).get(key):
                        assert ref["key"] in data[(kind, ref["name"])], (kind, ref)
                # $(VAR) expands only variables defined before it in env.
                assert set(re.findall(r"\$\((\w+)\)", e.get("value", ""))) <= defined, e["name"]
                defined.add(e["name"])
    for auth in m.of_kind("TriggerAuthentication"):
        for ref in auth["spec"]["secretTargetRef"]:
            assert ref["key"] in data[("Secret", ref["name"])]


def _settings_env(c: dict) -> dict[str, str]:
    env = {}
    for source in c.get("envFrom", []):
        if "configMapRef" in source:
            env.update(m.named("ConfigMap", source["configMapRef"]["name"])["data"])
        else:
            raw = m.named("Secret", source["secretRef"]["name"])["data"]
            env.update({k: base64.b64decode(v).decode() for k, v in raw.items()})
    env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
    return {k: v for k, v in env.items() if k.startswith("ENGINEFARM_")}


@pytest.mark.parametrize("name,obj", _pods(), ids=[n for n, _ in _pods()])
def test_every_enginefarm_variable_is_a_setting_with_a_valid_value(name, obj):
    for c in m.pod_spec(obj)["containers"]:
        env = _settings_env(c)
        fields = {k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items()}
        assert set(fields) <= set(Settings.model_fields), set(fields) - set(Settings.model_fields)
        values = {k: v for k, v in fields.items() if "$(" not in v}
        settings = Settings(_env_file=None, **values)  # pydantic refuses a value the farm would refuse
        assert settings.blob_store == "s3" and settings.database_url.startswith("postgresql+psycopg://")


def test_workers_outlast_a_build_on_sigterm():
    build_limit = Settings(_env_file=None).build_time_limit_s
    for group in m.worker_groups().values():
        grace = group.spec["terminationGracePeriodSeconds"]
        shutdown = float(m.env_value(m.container(group.deployment), "ENGINEFARM_SHUTDOWN_GRACE_SECONDS"))
        assert build_limit <= shutdown < grace <= shutdown + 120, group.name


def test_api_queues_builds_for_workers_scaled_to_zero():
    api = m.container(m.named("Deployment", "enginefarm-api"))
    assert any(s["spec"]["minReplicaCount"] == 0 for s in m.of_kind("ScaledObject"))
    assert (
        Settings(
            _env_file=None, queue_without_worker=m.env_value(api, "ENGINEFARM_QUEUE_WITHOUT_WORKER")
        ).queue_without_worker
        is True
    )
    # The reconciler Deployment does the background work; API processes do not run it too.
    assert m.env_value(api, "ENGINEFARM_RECONCILE_SECONDS") == "0"
    assert m.container(m.named("Deployment", "enginefarm-reconciler"))["args"] == ["reconcile", "--loop"]
    assert m.container(m.named("Job", "enginefarm-migrate"))["args"] == ["migrate"]


def test_ingress_takes_the_largest_upload_unbuffered():
    ingress = m.named("Ingress", "enginefarm-api")
    notes = ingress["metadata"]["annotations"]
    size = re.fullmatch(r"(\d+)([kmg]?)", notes["nginx.ingress.kubernetes.io/proxy-body-size"].lower())
    assert int(size[1]) * NGINX_UNITS[size[2]] >= Settings(_env_file=None).max_upload_bytes
    assert notes["nginx.ingress.kubernetes.io/proxy-request-buffering"] == "off"
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    service = m.named("Service", backend["name"])
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    api = m.named("Deployment", "enginefarm-api")
    assert service["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()


def _selects(selector: dict, labels: dict) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items()


def test_network_policy_lets_in_only_the_ingress_and_prometheus():
    policies = m.of_kind("NetworkPolicy")
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]]
    assert deny and deny[0]["spec"]["policyTypes"] == ["Ingress"]  # every pod: no ingress unless allowed
    api_labels = m.named("Deployment", "enginefarm-api")["spec"]["template"]["metadata"]["labels"]
    worker_labels = next(iter(m.worker_groups().values())).deployment["spec"]["template"]["metadata"]["labels"]
    allowed = {}
    for p in policies:
        for rule in p["spec"].get("ingress", []):
            for who in ("api", "worker"):
                if _selects(p["spec"]["podSelector"], api_labels if who == "api" else worker_labels):
                    sources = {
                        f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for f in rule["from"]
                    }
                    allowed.setdefault(who, set()).update((s, port["port"]) for s in sources for port in rule["ports"])
    assert allowed == {"api": {("ingress-nginx", 8321), ("monitoring", 8321)}, "worker": {("monitoring", 9464)}}
    egress = [p for p in policies if "Egress" in p["spec"]["policyTypes"]]
    assert len(egress) == 1 and _selects(egress[0]["spec"]["podSelector"], api_labels)
    ports = {port["port"] for rule in egress[0]["spec"]["egress"] for port in rule["ports"]}
    assert {53, 5432, 6379, 443} <= ports  # DNS, PostgreSQL, Redis, S3


def test_disruption_budgets_cover_every_deployment():
    budgets = m.of_kind("PodDisruptionBudget")
    for d in m.of_kind("Deployment"):
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert sum(_selects(b["spec"]["selector"], labels) for b in budgets) == 1, d["metadata"]["name"]
