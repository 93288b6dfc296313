"""Renders a kustomization the way `kubectl apply -k` does, for the few kustomize features deploy/k8s uses.

Supported: `resources` (YAML files and directories with their own kustomization), `namespace`, `labels`
(`includeSelectors: false`), `images`, and `secretGenerator` from env files with
`generatorOptions.disableNameSuffixHash: true`. A kustomization with any other field is refused, so a new feature
is added here, rendered faithfully, before the tests pass again.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "secretGenerator", "generatorOptions"}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "IngressClass",
    "ClusterTriggerAuthentication",
}
# Where kustomize's `labels` with includeTemplates puts labels in a workload's pod template.
TEMPLATE_PATHS = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


class Unsupported(Exception):
    """The kustomization uses something this renderer does not render."""


def render(directory: Path) -> list[dict]:
    """Every object `kubectl apply -k directory` would send, in order."""
    directory = Path(directory)
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    if unknown := set(k) - SUPPORTED:
        raise Unsupported(f"{directory}/kustomization.yaml uses {sorted(unknown)}: not rendered by {__name__}")
    objects: list[dict] = []
    for entry in k.get("resources", []):
        path = directory / entry
        if path.is_dir():
            objects.extend(render(path))
        else:
            objects.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None)
    objects.extend(_secrets(directory, k))
    for obj in objects:
        if ns := k.get("namespace"):
            _set_namespace(obj, ns)
        for spec in k.get("labels", []):
            _add_labels(obj, spec)
        for image in k.get("images", []):
            for container in pod_containers(obj):
                _set_image(container, image)
    return objects


def _secrets(directory: Path, k: dict) -> list[dict]:
    generators = k.get("secretGenerator", [])
    if generators and not (k.get("generatorOptions") or {}).get("disableNameSuffixHash"):
        raise Unsupported(
            "secretGenerator without generatorOptions.disableNameSuffixHash: the hash suffix is not rendered here"
        )
    out = []
    for gen in generators:
        if unknown := set(gen) - {"name", "envs", "literals", "type"}:
            raise Unsupported(f"secretGenerator {gen.get('name')} uses {sorted(unknown)}")
        pairs: dict[str, str] = {}
        for env_file in gen.get("envs", []):
            pairs.update(read_env_file(directory / env_file))
        for literal in gen.get("literals", []):
            key, _, value = literal.partition("=")
            pairs[key] = value
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": gen["name"]},
                "type": gen.get("type", "Opaque"),
                "data": {key: base64.b64encode(value.encode()).decode() for key, value in pairs.items()},
            }
        )
    return out


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as kustomize reads an env file: blank lines and lines starting with # are skipped."""
    pairs = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not ENV_NAME.match(key):
            raise Unsupported(
                f"{path}:{number}: not KEY=VALUE (a bare KEY would be read from kustomize's own environment)"
            )
        pairs[key] = value
    return pairs


def _set_namespace(obj: dict, namespace: str) -> None:
    if obj["kind"] == "Namespace":
        obj["metadata"]["name"] = namespace
    elif obj["kind"] not in CLUSTER_SCOPED:
        obj["metadata"]["namespace"] = namespace


def _add_labels(obj: dict, spec: dict) -> None:
    if spec.get("includeSelectors"):
        raise Unsupported("labels with includeSelectors: selectors are immutable and not rendered here")
    obj["metadata"].setdefault("labels", {}).update(spec["pairs"])
    if spec.get("includeTemplates") and (template := pod_template(obj)) is not None:
        template.setdefault("metadata", {}).setdefault("labels", {}).update(spec["pairs"])


def _set_image(container: dict, image: dict) -> None:
    name, tag = split_image(container["image"])
    if name != image["name"]:
        return
    name = image.get("newName", name)
    if "digest" in image:
        container["image"] = f"{name}@{image['digest']}"
    else:
        tag = image.get("newTag", tag)
        container["image"] = f"{name}:{tag}" if tag else name


def split_image(ref: str) -> tuple[str, str | None]:
    """``registry:5000/a/b:tag`` -> (``registry:5000/a/b``, ``tag``); a digest stays part of the name."""
    if "@" in ref:
        return ref, None
    head, _, last = ref.rpartition("/")
    if ":" in last:
        last, _, tag = last.partition(":")
        return (f"{head}/{last}" if head else last), tag
    return ref, None


def pod_template(obj: dict) -> dict | None:
    path = TEMPLATE_PATHS.get(obj["kind"])
    node = obj
    for key in path or ():
        node = node.get(key) if isinstance(node, dict) else None
    return node if path and isinstance(node, dict) else None


def pod_containers(obj: dict) -> list[dict]:
    template = pod_template(obj)
    if template is None:
        return []
    spec = template.get("spec", {})
    return spec.get("initContainers", []) + spec.get("containers", [])
