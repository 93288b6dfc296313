"""What the fp16 conversion did: ``Fp16Report`` for the caller, and the ``Tally`` it is counted in over
the main graph and every control-flow body converted."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from worker.rewrite.fp16.keep_fp32 import REASONS


@dataclass
class Fp16Report:
    """What the conversion did. Node counts are over every graph of the source model, control-flow
    bodies included; ``kept_fp32`` and ``kept_fp32_nodes`` say which float nodes stayed float32 and why."""

    converter: str
    nodes: int
    fp16_nodes: int
    fp32_nodes: int
    # Constant nodes, Shape/Size, and nodes with no float32 input or output (integer shape
    # arithmetic, boolean logic); constants follow their readers.
    other_nodes: int
    # reason -> op type -> number of float nodes kept in float32 for that reason
    kept_fp32: dict[str, dict[str, int]]
    # node name -> reason, for every float node kept in float32
    kept_fp32_nodes: dict[str, str]
    casts_added: int
    initializers_fp16: int
    initializers_fp32: int
    keep_io_types: bool
    external_data: str | None = None
    notes: list[str] = field(default_factory=list)
    # the float nodes converted to fp16 (control-flow bodies first, then the main graph, each in graph order)
    fp16_node_names: list[str] = field(default_factory=list)

    def summary(self) -> str:
        kept = ", ".join(
            f"{reason} {sum(ops.values())} ({', '.join(f'{op} {n}' for op, n in sorted(ops.items()))})"
            for reason, ops in self.kept_fp32.items()
        )
        return (
            f"fp16: {self.fp16_nodes} of {self.nodes} nodes in fp16, {self.fp32_nodes} kept in fp32"
            f"{': ' + kept if kept else ''}; {self.other_nodes} others (constants, Shape, integer ops); "
            f"{self.casts_added} casts added; converted by {self.converter}"
        )


@dataclass
class Tally:
    """Counts over every graph converted."""

    nodes: int = 0
    float_nodes: int = 0
    kept: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    kept_nodes: dict[str, str] = field(default_factory=dict)
    converted: list[str] = field(default_factory=list)
    casts: int = 0
    library: str = ""
    notes: list[str] = field(default_factory=list)
    gemm_nodes: set[str] = field(default_factory=set)
    initializers_fp16: int = 0
    initializers_fp32: int = 0

    def add(self, nodes: list[tuple[str, str, bool]], reasons: dict[str, str], casts: int) -> None:
        """``nodes``: (name, op type, computes on float32) for each node of the source graph."""
        self.nodes += len(nodes)
        self.casts += casts
        for name, op_type, is_float in nodes:
            if not is_float:
                continue
            if op_type in ("MatMul", "Gemm"):
                self.gemm_nodes.add(name)
            self.float_nodes += 1
            if name in reasons:
                self.kept[reasons[name]][op_type] += 1
                self.kept_nodes[name] = reasons[name]
            else:
                self.converted.append(name)

    def merge(self, other: Tally) -> None:
        self.nodes += other.nodes
        self.float_nodes += other.float_nodes
        self.casts += other.casts
        for reason, ops in other.kept.items():
            self.kept[reason].update(ops)
        self.kept_nodes.update(other.kept_nodes)
        self.converted.extend(other.converted)
        self.gemm_nodes |= other.gemm_nodes
        self.initializers_fp16 += other.initializers_fp16
        self.initializers_fp32 += other.initializers_fp32
        self.library = self.library or other.library
        self.notes.extend(other.notes)

    def report(self, *, keep_io_types: bool, external_data: str | None) -> Fp16Report:
        """The report of the whole conversion, once every graph is counted in."""
        gemms = sorted(name for name in self.kept_nodes if name in self.gemm_nodes)
        if gemms:
            more = ", ..." if len(gemms) > 5 else ""
            self.notes.append(
                f"MatMul/Gemm kept in float32 ({', '.join(gemms[:5])}{more}): "
                "TensorRT-RTX builds no float32 GEMM for Turing (sm75)"
            )
        return Fp16Report(
            converter=self.library,
            nodes=self.nodes,
            fp16_nodes=self.float_nodes - len(self.kept_nodes),
            fp32_nodes=len(self.kept_nodes),
            other_nodes=self.nodes - self.float_nodes,
            kept_fp32={r: dict(self.kept[r]) for r in REASONS if r in self.kept},
            kept_fp32_nodes=self.kept_nodes,
            casts_added=self.casts,
            initializers_fp16=self.initializers_fp16,
            initializers_fp32=self.initializers_fp32,
            keep_io_types=keep_io_types,
            external_data=external_data,
            notes=self.notes,
            fp16_node_names=list(self.converted),
        )
