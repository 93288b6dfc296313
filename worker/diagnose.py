"""Turn a builder's failure into something a user can act on: the ONNX node it happened at (name, op type,
inputs), what the failure means, and what to do next.

TensorRT's parser names the node it rejects; its builder names internal layers whose names start with the ONNX
node's name (``/model.22/Range_5_shape_U139_mul`` comes from the node ``/model.22/Range_5``) or derive from an
output (``node_of_y``). Some builder messages arrive cut mid-word by the builder itself ("It is no)"); only
complete sentences reach the summary, and the full text stays in the build log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import onnx


@dataclass(frozen=True)
class Pattern:
    """A known failure: a regex over the builder's text, what it means, and the next step."""

    regex: str
    meaning: str
    next_step: str
    op_types: tuple[str, ...] = ()  # when the text names no node, the model's nodes of these types are the suspects


KNOWN_FAILURES: tuple[Pattern, ...] = (
    Pattern(
        r"element type \((\w+)\) differs from input \d+'s element type \((\w+)\)",
        "the fp16 graph mixes float and half tensors (typically shape or index arithmetic that must stay fp32)",
        "keep it in fp32: add its op type to the spec's keep_fp32_ops or its name to keep_fp32_layers",
    ),
    Pattern(
        r"FP32 GEMM is not supported",
        "TensorRT-RTX cannot compile fp32 matrix multiplies (MatMul, Gemm, LSTM/GRU/RNN) for Turing (sm75)",
        "build fp16 for sm75, or build fp32 for sm80 and newer",
    ),
    Pattern(
        r"ScopeType::kUNDEFINED|IfConditional",
        "TensorRT-RTX cannot build this If node (its condition or branches are not supported as exported)",
        "fold the If away: where its condition depends on an input (a sample rate, a mode flag), fix that input "
        "with the spec's fixed_inputs, give static shapes, and set graph_cleanup=onnxslim; else export the model "
        "without the branch, or build for onnxruntime",
        ("If",),
    ),
    Pattern(
        r"Unrecognized attribute: axis for operator DequantizeLinear",
        "per-channel DequantizeLinear (an axis attribute) needs ONNX opset 13 or newer",
        "export the model at opset 13 or newer, or let the farm quantize the float model from samples",
    ),
    Pattern(
        r"[Qq]uantized constant .* only allowed before DQ",
        "a quantized constant feeds something other than a DequantizeLinear, which TensorRT does not accept",
        "quantize with TensorRT's Q/DQ placement: upload the float model with samples and build int8 "
        "(the farm quantizes it), or use NVIDIA Model Optimizer's ONNX PTQ",
    ),
    Pattern(
        r"Plugin not found",
        "this node's op is not a standard ONNX operator and the backend has no implementation of it (the farm "
        "never loads plugin libraries that come with an upload)",
        "replace the custom op before export, or build for a backend that implements it",
    ),
    Pattern(
        r"No importer registered for op: (\w+)|Unsupported ONNX operator|is not supported",
        "the backend has no implementation of this operator",
        "build for onnxruntime, or replace the operator before export",
    ),
    Pattern(
        r"[Oo]ut of memory|insufficient memory|Requested amount of GPU memory",
        "the builder ran out of memory",
        "raise workspace_mib, lower the profile's max shapes, or build on a machine with more memory",
    ),
    Pattern(
        r"must have same number of dimensions|dimensions (?:must|do not) match|[Ii]ncompatible (?:dimensions|shapes)|"
        r"broadcast",
        "the shapes this build gives do not fit what the model computes at this node",
        "check the spec's shapes and fixed inputs against what the model accepts (try them in onnxruntime first)",
    ),
    Pattern(
        r"has dynamic shape|no optimization profile|must be specified in the optimization profile",
        "an input has dynamic dims that no optimization profile covers",
        "give every dynamic input min/opt/max shapes (--minShapes/--optShapes/--maxShapes)",
    ),
)

_NAME_PATTERNS = (
    r"name=([^\s,()]+)",
    r"node '([^']+)'",
    r"node_of_([^\s,'()]+)",
    r"operation '([^']+)'",
    r"\(([^\s()]+)\)",
)


def _node_table(model_path: Path | None) -> tuple[dict[str, onnx.NodeProto], dict[str, onnx.NodeProto]]:
    """Nodes by name and by output tensor; empty when the model cannot be read."""
    if model_path is None:
        return {}, {}
    try:
        graph = onnx.load(str(model_path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - diagnosis is best effort; the failure itself is reported anyway
        return {}, {}
    by_name = {n.name: n for n in graph.node if n.name}
    by_output = {o: n for n in graph.node for o in n.output}
    return by_name, by_output


def find_node(text: str, model_path: Path | None, op_types: tuple[str, ...] = ()) -> onnx.NodeProto | None:
    """The ONNX node a builder message is about: named exactly, the longest node name a builder layer name starts
    with, or the node producing a named output; else the first node of ``op_types``."""
    by_name, by_output = _node_table(model_path)
    if not by_name and not by_output:
        return None
    for pattern in _NAME_PATTERNS:
        for candidate in re.findall(pattern, text):
            if candidate in by_name:
                return by_name[candidate]
            if candidate in by_output:
                return by_output[candidate]
            prefixes = [name for name in by_name if candidate.startswith(name) and len(name) > 2]
            if prefixes:
                return by_name[max(prefixes, key=len)]
    for token in re.split(r"[\s:,()'\"]+", text):  # a parser message names the node as a bare word
        if token in by_name:
            return by_name[token]
    return next((n for n in by_output.values() if n.op_type in op_types), None)


def first_sentence(text: str) -> str:
    """The builder's first complete statement of the error, without source-file locations or cut fragments."""
    if "Error is:" in text:
        text = text.split("Error is:", 1)[1].strip().splitlines()[0]
    text = re.sub(r"\[[\w./]+\.(?:cpp|cu|h):[^\]]*\]", "", text)
    text = re.sub(r"\bIn \w+ at /\S+", "", text)
    text = re.sub(r"\[(?:ERROR|INTERNAL_ERROR)\]|Error Code \d+:", "", text)
    # A builder without a GPU reports the missing driver beside the real error; it is never the cause here.
    text = re.sub(r"\(?cudaError \d+: [^)]*\)?", "", text)
    text = re.sub(r"\s+", " ", text).strip(" ;:(")
    sentences = re.findall(r".*?[.!?](?=[\s;,]|$)", text)
    complete = "".join(sentences).strip() or text
    if complete.count("(") > complete.count(")"):  # the builder's own wrapper, cut with the rest
        complete = complete.replace("(", "", complete.count("(") - complete.count(")"))
    return complete


def node_text(node: onnx.NodeProto) -> str:
    inputs = ", ".join(i for i in node.input if i) or "none"
    return f"node {node.name!r} ({node.op_type}, inputs: {inputs})"


_PREFIXES = ("the builder produced no engine", "the ONNX parser rejected the model")


def explain(message: str, model_path: Path | None = None) -> str:
    """The failure as a user reads it: what went wrong, at which node, what to do; the builder's words last."""
    pattern = next((p for p in KNOWN_FAILURES if re.search(p.regex, message)), None)
    node = find_node(message, model_path, pattern.op_types if pattern else ())
    where = f" at {node_text(node)}" if node is not None else ""
    head, sep, rest = message.partition(": ")
    if not sep or head not in _PREFIXES:
        head, rest = "", message
    said = first_sentence(rest)
    if pattern is None:
        return f"{head}{where}: {said}" if head else f"{said}{where}"
    return f"{pattern.meaning}{where}. Next step: {pattern.next_step}. The builder said: {said}"
