"""Larger networks for the int8 benchmark (bench/models.py): ResNet-50, ConvNeXt-Tiny and a GPT-2 style decoder,
exported from torch with random weights by ``export_large.py``. Not in ``MODELS``: the tests that build every
corpus model for every target would spend minutes on them. ``path`` and ``samples`` work as the corpus's do."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.realmodels import RealModel, _image, _profile, _version, cache_dir, cached

EXPORT_SCRIPT = Path(__file__).resolve().parent / "export_large.py"
GPT2_VOCAB = 8192


def _tokens(rng, shapes):
    n, seq = shapes["input_ids"]
    return {"input_ids": rng.integers(0, GPT2_VOCAB, (n, seq)).astype(np.int64)}


LARGE: dict[str, RealModel] = {
    m.name: m
    for m in [
        RealModel(
            name="resnet50",
            kind="cnn-classification",
            source="ResNet-50 (torchvision's layers, batch-norm statistics from random images), torch dynamo export, "
            "opset 17, dynamic batch",
            inputs={"input": "float32"},
            shapes=_profile(input=([1, 3, 224, 224], [1, 3, 224, 224], [8, 3, 224, 224])),
            value_ranges={"input": [-2.5, 2.5]},
            sampler=_image("input", 0.45, 0.25),
        ),
        RealModel(
            name="convnext",
            kind="cnn-classification",
            source="ConvNeXt-Tiny (timm's convnext_tiny layers), torch dynamo export, opset 17, dynamic batch",
            inputs={"input": "float32"},
            shapes=_profile(input=([1, 3, 224, 224], [1, 3, 224, 224], [8, 3, 224, 224])),
            value_ranges={"input": [-2.5, 2.5]},
            sampler=_image("input", 0.45, 0.25),
        ),
        RealModel(
            name="gpt2",
            kind="transformer-decoder",
            source="transformers GPT2Config(vocab_size=8192, n_embd=128, n_layer=4, n_head=4) random weights, "
            "torch dynamo export, opset 18, dynamic batch and sequence",
            inputs={"input_ids": "int64"},
            shapes=_profile(input_ids=([1, 1], [1, 64], [8, 256])),
            value_ranges={"input_ids": [0, GPT2_VOCAB - 1]},
            sampler=_tokens,
        ),
    ]
}


def path(name: str) -> Path:
    """The network's cached ONNX file, exported on first use."""
    versions = [_version(p) for p in ("torch", "transformers", "onnxscript", "onnx")]
    key = hashlib.sha256(f"{name}|{EXPORT_SCRIPT.read_text()}|{versions}".encode()).hexdigest()[:12]

    def export(tmp: Path) -> None:
        done = subprocess.run(
            [sys.executable, str(EXPORT_SCRIPT), name, str(tmp)], capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0:
            raise RuntimeError(f"exporting {name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")

    return cached(cache_dir() / f"{name}-{key}" / f"{name}.onnx", export)


def samples(name: str, count: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """``count`` inputs at the opt shapes, stacked on axis 0; deterministic for a seed."""
    model = LARGE[name]
    shapes = model.opt_shapes()
    for dims in shapes.values():
        dims[0] = count
    return model.sampler(np.random.default_rng(seed), shapes)
