"""The real-model corpus through the farm's stages: every model × target × precision ends in success or in a refusal
or failure that names the node or limit and says what to do. docs/models.md records the same matrix.

Each "was broken" test below fails on the code before its fix; the failures were seen with these very models.
"""

from __future__ import annotations

import re

import pytest

from tests.realmodels import MODELS
from tests.realmodels.matrix import PRECISIONS, TARGETS, Cell, run_matrix, summary

CPU = "onnxruntime/cpu-x86_64"
ACTIONABLE = re.compile(r"node '[^']+' \(|\[source: |Next step: |; build \w+ for|give |use |upload ")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> dict[tuple[str, str, str], Cell]:
    cells, _ = run_matrix(work=tmp_path_factory.mktemp("matrix"))
    return {c.key: c for c in cells}


def test_the_corpus_covers_what_users_bring():
    kinds = {m.kind for m in MODELS.values()}
    assert len(MODELS) >= 6
    assert {"cnn-classification", "detection", "transformer-encoder", "recurrent", "control-flow"} <= kinds


def test_every_cell_succeeds_or_says_what_to_do(matrix):
    assert len(matrix) == len(MODELS) * len(TARGETS) * len(PRECISIONS)
    for cell in matrix.values():
        if cell.outcome == "ok":
            assert cell.engine_bytes and cell.engine_bytes > 0 and cell.build_s is not None, cell
            if cell.target == CPU:  # engines this machine runs get benchmark and accuracy rows
                assert cell.p50_ms and cell.p50_ms > 0, cell
                assert cell.accuracy is not None and "worst" in cell.accuracy, cell
                assert not cell.check_errors, cell
        else:
            assert ACTIONABLE.search(cell.reason), f"{cell.key}: {cell.reason}"
            assert "It is no)" not in cell.reason  # a builder's cut sentence never reaches the user


def test_at_least_85_percent_of_cells_succeed(matrix):
    counts = summary(list(matrix.values()))
    assert counts.get("ok", 0) / counts["cells"] >= 0.85, counts


def test_fp32_cpu_artifacts_pass_the_accuracy_gate(matrix):
    """Was broken: the OCR detector's fp32 artifact failed with cosine 0.99997 and mean abs error 8e-10."""
    for name in MODELS:
        cell = matrix[(name, CPU, "fp32")]
        assert cell.outcome == "ok" and cell.accuracy["pass"] is True, (name, cell.accuracy)


def test_yolov8_fp16_builds_on_every_rtx_target(matrix):
    """Was broken: the whole graph cast to fp16 made a Range mix float and half on every target."""
    for target in TARGETS[:-1]:
        assert matrix[("yolov8n", target, "fp16")].outcome == "ok", matrix[("yolov8n", target, "fp16")].reason


@pytest.mark.parametrize("name", ["bert", "yolov8n", "ppocr-det"])
def test_int8_from_samples_builds_with_tensorrt_rtx(matrix, name):
    """Was broken: opset 12 gave "Unrecognized attribute: axis for operator DequantizeLinear"; BERT and YOLOv8 gave
    "Quantized constant ... is only allowed before DQ"."""
    cell = matrix[(name, "tensorrt-rtx/sm86", "int8")]
    assert cell.outcome == "ok", cell.reason


def test_bert_benchmarks_with_token_ids_inside_the_vocabulary(matrix):
    """Was broken: random integers 0..7 indexed the 2-row token-type table out of range, and the benchmark crashed."""
    for precision in ("fp32", "int8"):
        cell = matrix[("bert", CPU, precision)]
        assert cell.outcome == "ok" and cell.p50_ms > 0 and not cell.check_errors, cell


def test_turing_fp32_gemm_is_refused_before_building(matrix):
    cell = matrix[("bert", "tensorrt-rtx/sm75", "fp32")]
    assert cell.outcome == "refused" and "FP32 GEMM is not supported" in cell.reason and "build fp16" in cell.reason
    assert matrix[("bert", "tensorrt-rtx/sm75", "fp16")].outcome == "ok"


def test_silero_lstm_inside_an_if_builds_once_the_sample_rate_is_fixed(matrix):
    for target in ("tensorrt-rtx/sm86", "tensorrt-rtx/sm120", CPU):
        assert matrix[("silero-vad", target, "fp32")].outcome == "ok", matrix[("silero-vad", target, "fp32")].reason
