"""deploy/k8s rendered once, and what the tests read from it: objects by kind, worker groups and their targets and
queues (from the workers' own command lines, parsed by enginefarm.core.domain), the vendored KEDA schemas."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from enginefarm.core.domain import Target, build_queues
from tests.deploy.kustomize import pod_template, render

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KEDA_SCHEMAS = Path(__file__).parent / "keda"
KEDA_KINDS = {"ScaledObject": "scaledobject.yaml", "TriggerAuthentication": "triggerauthentication.yaml"}


@cache
def _rendered() -> tuple:
    return tuple(render(K8S))


def objects() -> list[dict]:
    """A fresh copy each call: tests may change what they get."""
    return yaml.safe_load(yaml.safe_dump(list(_rendered())))


def of_kind(kind: str) -> list[dict]:
    return [o for o in objects() if o["kind"] == kind]


def named(kind: str, name: str) -> dict:
    found = [o for o in of_kind(kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def pod_spec(obj: dict) -> dict:
    return pod_template(obj)["spec"]


def container(obj: dict, name: str | None = None) -> dict:
    containers = pod_spec(obj)["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def env_value(c: dict, name: str) -> str | None:
    return next((e.get("value") for e in c.get("env", []) if e["name"] == name), None)


@dataclass(frozen=True)
class WorkerGroup:
    deployment: dict
    targets: tuple[Target, ...]
    bench: tuple[Target, ...]

    @property
    def name(self) -> str:
        return self.deployment["metadata"]["name"]

    @property
    def build_queues(self) -> set[str]:
        return set(build_queues(list(self.targets)))  # as `enginefarm worker` does

    @property
    def bench_queues(self) -> set[str]:
        return {t.bench_queue for t in self.bench}

    @property
    def queues(self) -> set[str]:
        return self.build_queues | self.bench_queues

    @property
    def spec(self) -> dict:
        return pod_spec(self.deployment)

    @property
    def gpus(self) -> int:
        return int(container(self.deployment)["resources"].get("limits", {}).get("nvidia.com/gpu", 0))


def _option(args: list[str], flag: str) -> list[Target]:
    assert flag in args, f"worker without {flag}: {args}"
    text = args[args.index(flag) + 1]
    return [] if text == "none" else [Target.parse(t) for t in text.split(",")]


def worker_groups() -> dict[str, WorkerGroup]:
    """Worker Deployments by name, with the targets their `enginefarm worker` command serves."""
    groups = {}
    for d in of_kind("Deployment"):
        c = container(d)
        if c.get("args", [])[:1] != ["worker"]:
            continue
        groups[d["metadata"]["name"]] = WorkerGroup(
            d, tuple(_option(c["args"], "--targets")), tuple(_option(c["args"], "--bench-targets"))
        )
    return groups


def keda_schema(kind: str) -> dict:
    return yaml.safe_load((KEDA_SCHEMAS / KEDA_KINDS[kind]).read_text())


def strict(schema: dict) -> dict:
    """The schema as the API server applies it with strict field validation: an object schema with properties
    accepts no other field (unless it preserves unknown fields)."""
    schema = dict(schema)
    if "properties" in schema:
        schema["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    if isinstance(schema.get("items"), dict):
        schema["items"] = strict(schema["items"])
    if isinstance(schema.get("additionalProperties"), dict):
        schema["additionalProperties"] = strict(schema["additionalProperties"])
    return schema
