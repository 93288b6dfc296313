"""Where the scheduler may put a pod: nodeSelector, required node affinity, taints and tolerations, and extended
resources (a pod asking for nvidia.com/gpu needs a node that has one), as kube-scheduler's filters decide them.
Soft terms (preferred affinity, PreferNoSchedule, topology spread with ScheduleAnyway) do not exclude a node and
are not judged here.

NODES are realistic nodes with the labels NVIDIA's GPU Feature Discovery (k8s-device-plugin's internal/lm:
product, family, compute.major/minor, memory, count, replicas, machine) and the GPU Operator
(nvidia.com/gpu.present) put on them, and the taint GPU node pools usually carry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Node:
    name: str
    labels: dict[str, str]
    taints: tuple[dict, ...] = ()
    allocatable: dict[str, int] = field(default_factory=dict)


def expression_matches(expr: dict, labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    raise ValueError(f"unknown node selector operator {op!r}")


def term_matches(term: dict, node: Node) -> bool:
    """A nodeSelectorTerm: all its expressions hold (matchFields: only metadata.name, the one field allowed)."""
    fields = {"metadata.name": node.name}
    exprs = term.get("matchExpressions", [])
    field_exprs = term.get("matchFields", [])
    if not exprs and not field_exprs:
        return False  # an empty term selects nothing
    return all(expression_matches(e, node.labels) for e in exprs) and all(
        expression_matches(e, fields) for e in field_exprs
    )


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint["key"]:
                return True
        elif t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def extended_requests(pod_spec: dict) -> dict[str, int]:
    """Extended resources (those with a domain, like nvidia.com/gpu) the pod's containers ask for, summed."""
    wanted: dict[str, int] = {}
    for c in pod_spec.get("containers", []):
        res = c.get("resources", {})
        for name, amount in {**res.get("limits", {}), **res.get("requests", {})}.items():
            if "/" in name and not name.startswith("kubernetes.io/"):
                wanted[name] = wanted.get(name, 0) + int(amount)
    return wanted


def why_not(pod_spec: dict, node: Node) -> str | None:
    """None if the pod may be scheduled on ``node``; otherwise the first filter that rejects it."""
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value}"
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is not None and not any(term_matches(t, node) for t in required.get("nodeSelectorTerms", [])):
        return "required node affinity"
    for taint in node.taints:
        if taint["effect"] in ("NoSchedule", "NoExecute") and not tolerates(pod_spec.get("tolerations", []), taint):
            return f"untolerated taint {taint['key']}:{taint['effect']}"
    for name, amount in extended_requests(pod_spec).items():
        if node.allocatable.get(name, 0) < amount:
            return f"insufficient {name}"
    return None


def fits(pod_spec: dict, node: Node) -> bool:
    return why_not(pod_spec, node) is None


def _gpu_node(
    name: str,
    product: str,
    family: str,
    cc: str,
    memory: int,
    count: int,
    *,
    arch: str = "amd64",
    machine: str = "",
    replicas: int = 1,
    operator: bool = True,
    taint: bool = True,
) -> Node:
    major, minor = cc.split(".")
    labels = {
        "kubernetes.io/arch": arch,
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.compute.major": major,
        "nvidia.com/gpu.compute.minor": minor,
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.replicas": str(replicas),
    }
    if machine:
        labels["nvidia.com/gpu.machine"] = machine
    if operator:  # the GPU Operator's node labels (from NFD's PCI vendor 10de)
        labels.update(
            {
                "nvidia.com/gpu.present": "true",
                "feature.node.kubernetes.io/pci-10de.present": "true",
                "nvidia.com/gpu.deploy.device-plugin": "true",
                "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
                "nvidia.com/cuda.driver.major": "580",
                "nvidia.com/cuda.driver.minor": "95",
            }
        )
    return Node(name, labels, (GPU_TAINT,) if taint else (), {GPU: count * replicas})


NODES = {
    n.name: n
    for n in [
        _gpu_node("hgx-h100", "NVIDIA-H100-80GB-HBM3", "hopper", "9.0", 81559, 8, machine="DGX-H100"),
        # Grace Hopper: compute capability 9.0 too, but an arm64 host.
        _gpu_node(
            "gh200", "NVIDIA-GH200-480GB", "hopper", "9.0", 97871, 1, arch="arm64", machine="ProLiant-DL384-Gen12"
        ),
        _gpu_node("dgx-a100", "NVIDIA-A100-SXM4-80GB", "ampere", "8.0", 81920, 8, machine="DGXA100-920-23687-2530-000"),
        # The same GPUs shared by time-slicing (4 replicas each): GFD marks the product SHARED.
        _gpu_node("a100-shared", "NVIDIA-A100-SXM4-80GB-SHARED", "ampere", "8.0", 81920, 2, replicas=4),
        _gpu_node("g5-a10g", "NVIDIA-A10G", "ampere", "8.6", 23028, 1, machine="g5.2xlarge"),
        _gpu_node("g2-l4", "NVIDIA-L4", "ada-lovelace", "8.9", 23034, 1, machine="g2-standard-8"),
        # A workstation in the farm: no GPU Operator (device plugin + GFD only), no taint.
        _gpu_node(
            "ws-rtx4090", "NVIDIA-GeForce-RTX-4090", "ada-lovelace", "8.9", 24564, 1, operator=False, taint=False
        ),
        # Jetson AGX Orin 64 GB on JetPack 6 with the device plugin: Tegra, so GFD labels it from CUDA, not NVML;
        # no GPU Operator there, no taint.
        _gpu_node("agx-orin", "Orin", "ampere", "8.7", 62841, 1, arch="arm64", operator=False, taint=False),
        Node(
            "cpu-amd64",
            {
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": "cpu-amd64",
                "node.kubernetes.io/instance-type": "m7i.4xlarge",
            },
        ),
        Node(
            "cpu-arm64",
            {
                "kubernetes.io/arch": "arm64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": "cpu-arm64",
                "node.kubernetes.io/instance-type": "c7g.4xlarge",
            },
        ),
    ]
}
