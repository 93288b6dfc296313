"""A corpus of hostile requests: each entry is one request, the status it must get, and a phrase of the answer.

Rejections name a specific 4xx and a phrase of the error's ``detail`` (or of its ``problems`` /
validation messages). Query strings that can never match anything (SQL fragments, RTL marks, emoji,
overlong values) may instead get a clean empty page (200) or a 404, never a 5xx. Bodies are built by
``tests.corpus.files`` when the request is made; nothing binary is stored here.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from enginefarm.graph.samples import sample_spec
from tests.corpus import files as f
from tests.helpers import unique_name

ID_MAX = (1 << 31) - 1
HUGE_ID = 10**20
SQL = "' OR 1=1 --"
RTL = "\u202egnp.exe"  # right-to-left override: renders as "exe.png"
EMOJI = "\U0001f4a3\U0001f525"
LONG = "x" * 10_000
# Long, but a request line that holds it stays within the server's 8 KiB: what the app itself says of it.
HALF_LONG = "x" * 5_000
# The server refuses a request line past 8 KiB before the app sees it (server/headlimits.py).
LINE_TOO_LONG = "the request line is longer than 8192 bytes"
PROFILE = sample_spec()["profiles"]  # the sample model's dynamic batch: 1..8, opt 4


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    anonymous: bool = False  # sent without the session's token


@dataclass
class Context:
    """What requests refer to: a valid model to aim specs and samples at, and the names uploads used."""

    model_id: int
    model_name: str
    tmp: Path
    names: list[str] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)  # read, build, revoked, expired
    before: dict[str, Any] = field(default_factory=dict)  # what the corpus must leave unchanged

    def name(self, value: str | None = None) -> str:
        """A model name for one upload (fresh unless given), remembered for the leftovers check."""
        value = unique_name("hostile") if value is None else value
        self.names.append(value)
        return value

    @property
    def pickle_marker(self) -> Path:
        """Created only if the server unpickled a samples file."""
        return self.tmp / "unpickled-by-server"


@dataclass(frozen=True)
class Entry:
    id: str
    category: str
    request: Callable[[Context], Request]
    status: int
    message: str
    known_failure: str | None = None  # why the farm still answers this one wrongly (the test is xfail)


# --------------------------------------------------------------------------- request builders


def upload(
    body: Callable[[], bytes], filename: str = "model.onnx", name: str | None = None, version: str | None = None
) -> Callable[[Context], Request]:
    def make(ctx: Context) -> Request:
        data = {"name": ctx.name(name)}
        if version is not None:
            data["version"] = version
        return Request("POST", "/v1/models", {"data": data, "files": {"file": (filename, body())}})

    return make


def raw_upload(body: Callable[[str], bytes], content_type: str) -> Callable[[Context], Request]:
    """A hand-written multipart body; ``body`` gets the model name to put in it."""
    return lambda ctx: Request(
        "POST", "/v1/models", {"content": body(ctx.name()), "headers": {"content-type": content_type}}
    )


def build(
    spec: dict | None = None, targets: list | None = None, model_id: Any = None, **body: Any
) -> Callable[[Context], Request]:
    def make(ctx: Context) -> Request:
        payload = {
            "model_id": ctx.model_id if model_id is None else model_id,
            "targets": ["tensorrt-rtx/sm86"] if targets is None else targets,
            "spec": {"profiles": PROFILE} if spec is None else spec,
            **body,
        }
        return Request("POST", "/v1/builds", {"json": payload})

    return make


def with_profile(**fields: Any) -> dict:
    return {"profiles": PROFILE, **fields}


def raw_json(url: str, body: Callable[[Context], bytes]) -> Callable[[Context], Request]:
    return lambda ctx: Request("POST", url, {"content": body(ctx), "headers": {"content-type": "application/json"}})


def sweep(axes: Any, model_id: Any = None, spec: dict | None = None) -> Callable[[Context], Request]:
    def make(ctx: Context) -> Request:
        payload = {
            "model_id": ctx.model_id if model_id is None else model_id,
            "targets": ["tensorrt-rtx/sm89"],
            "spec": {"profiles": PROFILE} if spec is None else spec,
            "axes": axes,
        }
        return Request("POST", "/v1/sweeps", {"json": payload})

    return make


def samples(
    body: Callable[[Context], bytes], filename: str = "samples.npz", model_id: Any = None
) -> Callable[[Context], Request]:
    def make(ctx: Context) -> Request:
        mid = ctx.model_id if model_id is None else model_id
        return Request("POST", f"/v1/models/{mid}/samples", {"files": {"file": (filename, body(ctx))}})

    return make


def get(url: str | Callable[[Context], str], **params: Any) -> Callable[[Context], Request]:
    return lambda ctx: Request("GET", url(ctx) if callable(url) else url, {"params": params})


def resolve_post(**body: Any) -> Callable[[Context], Request]:
    return lambda ctx: Request("POST", "/v1/resolve", {"json": body})


def ext(*args, **kwargs) -> Callable[[Context], Request]:
    return upload(f.external(*args, **kwargs), "bundle.zip")


def as_(who: str | None, make: Callable[[Context], Request], header: str | None = None) -> Callable[[Context], Request]:
    """The request sent with another Authorization: none (``who`` None), one of the context's tokens by role,
    or a literal header value."""

    def wrapped(ctx: Context) -> Request:
        req = make(ctx)
        if who is None and header is None:
            return Request(req.method, req.url, req.kwargs, anonymous=True)
        value = header if header is not None else f"Bearer {ctx.tokens[who]}"
        headers = {**req.kwargs.get("headers", {}), "Authorization": value}
        return Request(req.method, req.url, {**req.kwargs, "headers": headers})

    return wrapped


def E(
    id: str,  # noqa: A002 - the corpus entry's id
    category: str,
    request: Callable[[Context], Request],
    status: int,
    message: str,
    known_failure: str | None = None,
) -> Entry:
    return Entry(id, category, request, status, message, known_failure)


# --------------------------------------------------------------------------- the corpus

_BOUNDARY = "c0rpusB0undary"
_MULTIPART = f"multipart/form-data; boundary={_BOUNDARY}"


def _multipart_head(name: str) -> bytes:
    return (
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\n\r\n{name}\r\n'
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="m.onnx"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n"
    ).encode()


ONNX = [
    E("empty-file", "onnx", upload(lambda: b""), 422, "the uploaded file is empty"),
    E("random-64k", "onnx", upload(f.random_bytes), 422, "not an ONNX model"),
    E("json-text", "onnx", upload(f.json_text, "model.json"), 422, "not an ONNX model"),
    E("protobuf-textproto", "onnx", upload(f.textproto, "model.txt"), 422, "not an ONNX model"),
    E("truncated-half", "onnx", upload(f.truncated), 422, "truncated ONNX file"),
    E("truncated-to-one-byte", "onnx", upload(lambda: b"\x08"), 422, "truncated ONNX file"),
    E("gzip-compressed", "onnx", upload(f.gzipped, "model.onnx.gz"), 422, "not an ONNX model"),
    E("no-ir-version", "onnx", upload(f.no_ir_version), 422, "no ir_version"),
    E(
        "ir-version-too-new",
        "onnx",
        upload(lambda: f.ir_version(onnx.IR_VERSION + 5)),
        422,
        "newer than this server reads",
    ),
    E("ir-version-2-with-opset", "onnx", upload(lambda: f.ir_version(2)), 422, "IR version < 3"),
    E("no-graph", "onnx", upload(f.no_graph), 422, "has no graph"),
    E("graph-without-nodes", "onnx", upload(f.no_nodes), 422, "no nodes or no outputs"),
    E("graph-without-outputs", "onnx", upload(f.no_outputs), 422, "no nodes or no outputs"),
    E("unknown-op-in-subgraph", "onnx", upload(f.unknown_op_in_subgraph), 422, "No Op registered for NoSuchOp"),
    E("op-of-unimported-domain", "onnx", upload(f.unimported_domain), 422, "No opset import for domain 'com.evil'"),
    E("no-default-opset", "onnx", upload(f.only_custom_domain), 422, "imports no opset for the default ONNX domain"),
    E("node-input-missing", "onnx", upload(f.missing_node_input), 422, "input 'ghost'"),
    E("node-cycle", "onnx", upload(f.cycle), 422, "topologically sorted"),
    E("opset-zero", "onnx", upload(f.opset_zero), 422, "domain_version of 0"),
    E("huge-declared-dim", "onnx", upload(f.huge_declared_dim), 422, f"declares dim {1 << 62}"),
    E("sequence-input", "onnx", upload(f.sequence_input), 422, "is of type sequence, not a tensor"),
    E("optional-input", "onnx", upload(f.optional_input), 422, "is of type optional, not a tensor"),
    E("undefined-element-type", "onnx", upload(f.undefined_elem_type), 422, "has no element type"),
    E("input-name-not-utf8", "onnx", upload(f.invalid_utf8_input_name), 422, "is not valid UTF-8"),
    E(
        "initializer-2e60-elements-no-data",
        "onnx",
        upload(f.initializer_without_data),
        422,
        "should contain one and only one value field",
    ),
    E("raw-data-shorter-than-shape", "onnx", upload(f.raw_data_too_short), 422, "is too small for the declared shape"),
    E(
        "plain-onnx-with-external-data",
        "onnx",
        upload(f.plain_onnx_with_external_data),
        422,
        "keeps tensors in external files",
    ),
]

BUNDLES = [
    E(
        "zip-plugin-library",
        "bundle",
        upload(lambda: f.zip_bytes({"model.onnx": f.valid_onnx(), "libcustom_ops.so": b"\x7fELF"}), "b.zip"),
        422,
        "plugin and custom-op libraries that come with an upload are never loaded",
    ),
    E(
        "tar-plugin-library-versioned",
        "bundle",
        upload(
            lambda: f.tar_bytes({"model.onnx": f.valid_onnx(), "plugins/libnvinfer_plugin.so.10": b"\x7fELF"}), "b.tar"
        ),
        422,
        "is a native library",
    ),
    E(
        "zip-windows-plugin",
        "bundle",
        upload(lambda: f.zip_bytes({"model.onnx": f.valid_onnx(), "CustomOp.DLL": b"MZ"}), "b.zip"),
        422,
        "is a native library",
    ),
    E(
        "zip-nested-dotdot",
        "bundle",
        upload(lambda: f.zip_bytes({"model.onnx": f.valid_onnx(), "a/../../x.bin": b"x"}), "b.zip"),
        422,
        "escapes the bundle",
    ),
    E(
        "tar-dotdot",
        "bundle",
        upload(lambda: f.tar_bytes({"model.onnx": f.valid_onnx(), "../x.bin": b"x"}), "b.tar"),
        422,
        "escapes the bundle",
    ),
    E(
        "tar-absolute-path",
        "bundle",
        upload(lambda: f.tar_bytes({"model.onnx": f.valid_onnx(), "/tmp/evil.bin": b"x"}), "b.tar"),
        422,
        "is an absolute path",
    ),
    E(
        "zip-windows-drive",
        "bundle",
        upload(lambda: f.zip_bytes({"model.onnx": f.valid_onnx(), "C:/evil.bin": b"x"}), "b.zip"),
        422,
        "is an absolute path",
    ),
    E(
        "zip-backslash-dotdot",
        "bundle",
        upload(lambda: f.zip_bytes({"model.onnx": f.valid_onnx(), "..\\evil.bin": b"x"}), "b.zip"),
        422,
        "backslash",
    ),
    E(
        "zip-name-component-over-255",
        "bundle",
        upload(lambda: f.zip_bytes({"model.onnx": f.valid_onnx(), "d" * 300 + ".bin": b"x"}), "b.zip"),
        422,
        "over 255 bytes",
    ),
    E("zip-symlink", "bundle", upload(f.zip_symlink, "b.zip"), 422, "is a symlink"),
    E(
        "tar-symlink-to-root",
        "bundle",
        upload(lambda: f.tar_special("data", b"2", "/"), "b.tar"),
        422,
        "a symlink to '/'",
    ),
    E(
        "tar-hardlink",
        "bundle",
        upload(lambda: f.tar_special("weights.bin", b"1", "/etc/shadow"), "b.tar"),
        422,
        "a hard link to '/etc/shadow'",
    ),
    E("tar-fifo", "bundle", upload(lambda: f.tar_special("pipe", b"6"), "b.tar"), 422, "a device file or fifo"),
    E("tar-char-device", "bundle", upload(lambda: f.tar_special("zero", b"3"), "b.tar"), 422, "a device file or fifo"),
    E("zip-encrypted", "bundle", upload(f.zip_encrypted_flag, "b.zip"), 422, "is encrypted"),
    E("zip-bomb-ratio", "bundle", upload(f.zip_bomb, "b.zip"), 413, "compression ratio"),
    E("tgz-bomb-ratio", "bundle", upload(f.tgz_bomb, "b.tgz"), 413, "compression ratio"),
    # The test farm's uploads are limited to 32 MiB, so bundles may expand to 64 MiB: 300 MiB is over that, and 40 MiB
    # is under it but over the whole archive's ratio.
    # The message both limits give: the farm's unpacked-size limit (64 MiB here) and, with the default limits
    # (tests/unit/storage/test_inspect_in_place.py), the whole archive's ratio.
    E(
        "zip-bomb-300-small-entries",
        "bundle",
        upload(f.zip_bomb_of_small_entries, "b.zip"),
        413,
        "bundle expands to 314585025 bytes",
    ),
    E(
        "zip-bomb-40-small-entries",
        "bundle",
        upload(lambda: f.zip_bomb_of_small_entries(40), "b.zip"),
        413,
        "the bundle expands to 41",
    ),
    E("zip-10001-files", "bundle", upload(f.zip_many_files, "b.zip"), 422, "over the limit of 10000"),
    E(
        "tgz-10001-files",
        "bundle",
        upload(f.tgz_many_files, "b.tgz"),
        422,
        "files and folders, over the limit of 10000",
    ),
    E(
        "zip-duplicate-model",
        "bundle",
        upload(lambda: f.zip_duplicate("model.onnx", f.valid_onnx(), f.valid_onnx(7)), "b.zip"),
        422,
        "holds 'model.onnx' twice",
    ),
    E("tar-duplicate-weights", "bundle", upload(f.tar_duplicate, "b.tar"), 422, "holds 'weights.bin' twice"),
    E(
        "zip-file-used-as-folder",
        "bundle",
        upload(lambda: f.zip_bytes({"model.onnx": f.valid_onnx(), "w": b"x", "w/x.bin": b"y"}), "b.zip"),
        422,
        "which is a file",
    ),
    E(
        "tar-without-model",
        "bundle",
        upload(lambda: f.tar_bytes({"net.onnx": f.valid_onnx()}), "b.tar"),
        422,
        "no model.onnx at its top level",
    ),
    E("zip-empty", "bundle", upload(f.empty_zip, "b.zip"), 422, "no model.onnx at its top level"),
    E(
        "zip-two-folders-two-models",
        "bundle",
        upload(lambda: f.zip_bytes({"a/model.onnx": f.valid_onnx(), "b/model.onnx": f.valid_onnx(8)}), "b.zip"),
        422,
        "no model.onnx at its top level",
    ),
    E(
        "zip-second-onnx-file",
        "bundle",
        upload(lambda: f.zip_bytes({"model.onnx": f.valid_onnx(), "model_fp16.onnx": f.valid_onnx(9)}), "b.zip"),
        422,
        "besides model.onnx: model_fp16.onnx",
    ),
    E(
        "tar-nested-second-onnx",
        "bundle",
        upload(lambda: f.tar_bytes({"model.onnx": f.valid_onnx(), "old/model.ONNX": f.valid_onnx(9)}), "b.tar"),
        422,
        "besides model.onnx: old/model.ONNX",
    ),
    E("zip-cut-short", "bundle", upload(f.zip_cut_short, "b.zip"), 422, "not a readable zip bundle"),
    E(
        "zip-model-is-a-zip",
        "bundle",
        upload(lambda: f.zip_bytes({"model.onnx": f.zip_bytes({"model.onnx": f.valid_onnx()})}), "b.zip"),
        422,
        "not an ONNX model",
    ),
]

EXTERNAL = [
    E(
        "ext-location-dotdot",
        "external-data",
        upload(f.external("tar", location="../weights.bin"), "b.tar"),
        422,
        "contains '..'",
    ),
    E("ext-location-absolute", "external-data", ext(location="/etc/passwd"), 422, "is absolute"),
    E("ext-location-windows-drive", "external-data", ext(location="C:\\Windows\\win.ini"), 422, "is absolute"),
    E("ext-location-backslash", "external-data", ext(location="sub\\weights.bin"), 422, "contains a backslash"),
    E("ext-location-nul", "external-data", ext(location="weights.bin\x00/../../etc/passwd"), 422, "empty or invalid"),
    E("ext-location-empty", "external-data", ext(location=""), 422, "empty or invalid"),
    E(
        "ext-location-not-in-bundle",
        "external-data",
        ext(location="elsewhere.bin"),
        422,
        "names a file the bundle does not hold",
    ),
    E(
        "ext-location-is-a-folder",
        "external-data",
        ext(extra={"sub/x.bin": b"x"}, location="sub"),
        422,
        "is not a regular file",
    ),
    E("ext-length-past-end", "external-data", ext(offset="0", length=lambda size: size + 1), 422, "holds only"),
    E("ext-offset-past-end", "external-data", ext(offset=str(1 << 40), length="4"), 422, "holds only"),
    E("ext-offset-negative", "external-data", ext(offset="-4096"), 422, "are negative"),
    E("ext-offset-not-integer", "external-data", ext(offset="0x10"), 422, "are not integers"),
    E("ext-in-constant-attribute", "external-data", upload(f.external_in_attribute, "b.zip"), 422, "contains '..'"),
]

SPECS = [
    E(
        "unknown-input-in-shapes",
        "spec",
        build(with_profile(shapes={"image": [1, 3, 32, 32]})),
        422,
        "unknown input 'image' (model inputs: input)",
    ),
    E(
        "negative-dim",
        "spec",
        build({"profiles": [{"input": {"min": [-1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32]}}]}),
        422,
        "has a dim outside 1..1048576",
    ),
    E("zero-dim-static", "spec", build({"shapes": {"input": [0, 3, 32, 32]}}), 422, "has a dim outside 1..1048576"),
    E(
        "dim-over-limit",
        "spec",
        build({"profiles": [{"input": {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [1 << 21, 3, 32, 32]}}]}),
        422,
        "has a dim outside 1..1048576",
    ),
    E(
        "min-greater-than-max",
        "spec",
        build({"profiles": [{"input": {"min": [8, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [1, 3, 32, 32]}}]}),
        422,
        "need min <= opt <= max, got 8, 4, 1",
    ),
    E(
        "input-in-shapes-and-profile",
        "spec",
        build(with_profile(shapes={"input": [1, 3, 32, 32]})),
        422,
        "give each input once",
    ),
    E("absurd-workspace", "spec", build(with_profile(workspace_mib=1 << 40)), 422, "less than or equal to 1048576"),
    E("workspace-as-text", "spec", build(with_profile(workspace_mib="lots")), 422, "valid integer"),
    E("precision-as-number", "spec", build(with_profile(precision=16)), 422, "Input should be 'fp32'"),
    E("optimization-level-11", "spec", build(with_profile(optimization_level=11)), 422, "less than or equal to 5"),
    E(
        "unknown-spec-field-nested",
        "spec",
        build(with_profile(benchmark={"warmup": 200})),
        422,
        "Extra inputs are not permitted",
    ),
    E(
        "unknown-profile-range-field",
        "spec",
        build(
            {"profiles": [{"input": {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32], "step": 1}}]}
        ),
        422,
        "Extra inputs are not permitted",
    ),
    E("spec-not-an-object", "spec", build([1, 2, 3]), 422, "valid dictionary"),
    E("model-id-as-text", "spec", build(model_id="1 OR 1=1"), 422, "valid integer"),
    E("model-id-over-int32", "spec", build(model_id=HUGE_ID), 422, f"between 1 and {ID_MAX}"),
    E("model-id-unknown", "spec", build(model_id=ID_MAX), 404, f"no model with id {ID_MAX}"),
    E("unknown-arch", "spec", build(targets=["tensorrt/sm61"]), 422, "tensorrt cannot build for 'sm61'"),
    E("unknown-backend", "spec", build(targets=["cuda/sm86"]), 422, "unknown backend 'cuda'"),
    E("target-without-backend", "spec", build(targets=["sm86"]), 422, "must be written BACKEND/ARCH"),
    E("target-sql", "spec", build(targets=["tensorrt-rtx/sm86" + SQL]), 422, "cannot build for"),
    E("targets-as-string", "spec", build(targets="tensorrt-rtx/sm86"), 422, "valid list"),
    E(
        "too-many-targets",
        "spec",
        build(targets=[f"tensorrt-rtx/sm{a}" for a in (75, 80, 86, 89, 120)] * 13),
        422,
        "at most 64 targets per build",
    ),
    E("targets-over-schema-limit", "spec", build(targets=["tensorrt-rtx/sm86"] * 1001), 422, "at most 1000 items"),
    E("int8-without-qdq-or-samples", "spec", build(with_profile(precision="int8")), 422, "calibration samples"),
    E(
        "fp8-without-qdq",
        "spec",
        build(with_profile(precision="fp8"), targets=["tensorrt-rtx/sm89"]),
        422,
        "fp8 needs a quantized model",
    ),
    E(
        "bf16-on-tensorrt-rtx",
        "spec",
        build(with_profile(precision="bf16", precision_fallback=False)),
        422,
        "tensorrt-rtx builds strongly typed",
    ),
    E(
        "ampere-plus-on-jetson",
        "spec",
        build(with_profile(hardware_compatibility="ampere_plus"), targets=["tensorrt/sm87"]),
        422,
        "not supported on Jetson",
    ),
    E(
        "bench-batch-outside-profile",
        "spec",
        build(with_profile(benchmark={"batch_sizes": [1, 64]})),
        422,
        "batch 64 is outside the profile's batch range 1..8",
    ),
    E(
        "bench-batch-zero",
        "spec",
        build(with_profile(benchmark={"batch_sizes": [0]})),
        422,
        "batch_sizes must be within",
    ),
    E(
        "bench-shape-wrong-rank",
        "spec",
        build(with_profile(benchmark={"shapes": [{"input": [4, 3, 32]}]})),
        422,
        "has rank 4, shape [4, 3, 32] has rank 3",
    ),
    E(
        "bench-shapes-and-batch-sizes",
        "spec",
        build(with_profile(benchmark={"shapes": [{"input": [4, 3, 32, 32]}], "batch_sizes": [4]})),
        422,
        "give either 'shapes' or 'batch_sizes'",
    ),
    E(
        "unknown-accuracy-tolerance",
        "spec",
        build(with_profile(accuracy={"tolerances": {"max_rel": 0.1}})),
        422,
        "unknown tolerance(s) ['max_rel']",
    ),
    E(
        "nan-tolerance",
        "spec",
        raw_json(
            "/v1/builds",
            lambda ctx: (
                '{"model_id": %d, "targets": ["tensorrt-rtx/sm86"], "spec": {"profiles": %s, '
                '"accuracy": {"tolerances": {"mean_abs": NaN}}}}' % (ctx.model_id, json.dumps(PROFILE))
            ).encode(),
        ),
        422,
        "must be finite numbers",
    ),
    E(
        "infinite-tolerance",
        "spec",
        raw_json(
            "/v1/builds",
            lambda ctx: (
                '{"model_id": %d, "targets": ["tensorrt-rtx/sm86"], "spec": {"profiles": %s, '
                '"accuracy": {"tolerances": {"cosine": -Infinity}}}}' % (ctx.model_id, json.dumps(PROFILE))
            ).encode(),
        ),
        422,
        "must be finite numbers",
    ),
    E(
        "json-nested-100k-deep",
        "spec",
        raw_json("/v1/builds", lambda ctx: b"[" * 100_000),
        400,
        "error parsing the body",
    ),
    E(
        "json-not-utf8",
        "spec",
        raw_json("/v1/builds", lambda ctx: b'{"model_id": 1, "targets": ["\xff\xfe"]}'),
        400,
        "error parsing the body",
    ),
    E(
        "json-malformed",
        "spec",
        raw_json("/v1/builds", lambda ctx: b'{"model_id": 1, "targets": [tensorrt-rtx/sm86]'),
        422,
        "JSON decode error",
    ),
    E(
        "target-lone-surrogate",
        "spec",
        raw_json("/v1/builds", lambda ctx: ('{"model_id": %d, "targets": ["\\ud800"]}' % ctx.model_id).encode()),
        422,
        "must be written BACKEND/ARCH",
    ),
    E("sweep-unknown-axis", "spec", sweep({"workspace_mib": [1, 2]}), 422, "cannot sweep 'workspace_mib'"),
    E(
        "sweep-180-variants",
        "spec",
        sweep(
            {
                "precision": ["fp32", "fp16", "bf16", "int8", "fp8"],
                "optimization_level": [0, 1, 2, 3, 4, 5],
                "hardware_compatibility": ["none", "ampere_plus", "same_compute_capability"],
                "strongly_typed": [True, False],
            }
        ),
        422,
        "the sweep has 180 variants; at most 64",
    ),
    E("sweep-empty-axis", "spec", sweep({"precision": []}), 422, "give 'precision' a non-empty list of values"),
    E(
        "sweep-repeated-value",
        "spec",
        sweep({"precision": ["fp32", "fp32"]}),
        422,
        "two variants of the sweep are the same",
    ),
    E("sweep-no-axes", "spec", sweep({}), 422, "name at least one axis"),
    E(
        "sweep-model-id-over-int32",
        "spec",
        sweep({"precision": ["fp32"]}, model_id=HUGE_ID),
        422,
        f"between 1 and {ID_MAX}",
    ),
]

SAMPLES = [
    E(
        "samples-not-npz",
        "samples",
        samples(lambda ctx: b"input,1,2,3\n" * 50, "samples.csv"),
        422,
        "not a readable .npz file",
    ),
    E("samples-bare-npy", "samples", samples(lambda ctx: f.bare_npy(), "samples.npy"), 422, "not a readable .npz file"),
    E(
        "samples-pickled-object-array",
        "samples",
        samples(lambda ctx: f.pickled_object_array(ctx.pickle_marker)),
        422,
        "Object arrays cannot be loaded when allow_pickle=False",
    ),
    E(
        "samples-raw-pickle",
        "samples",
        samples(lambda ctx: f.raw_pickle(ctx.pickle_marker), "samples.pkl"),
        422,
        "not a readable .npz file",
    ),
    E(
        "samples-wrong-input-name",
        "samples",
        samples(lambda ctx: f.npz(image=f.images())),
        422,
        "array 'image' is not a model input",
    ),
    E(
        "samples-wrong-rank",
        "samples",
        samples(lambda ctx: f.npz(input=f.images()[0])),
        422,
        "has rank 4, the array has shape [3, 32, 32]",
    ),
    E(
        "samples-fixed-dim-mismatch",
        "samples",
        samples(lambda ctx: f.npz(input=f.images(size=16))),
        422,
        "axis 2 is fixed at 32, the array has 16",
    ),
    E(
        "samples-string-dtype",
        "samples",
        samples(lambda ctx: f.npz(input=np.full((1, 3, 32, 32), "a"))),
        422,
        "the array is <U1",
    ),
    E(
        "samples-empty-array",
        "samples",
        samples(lambda ctx: f.npz(input=np.zeros((0, 3, 32, 32), np.float32))),
        422,
        "the array is empty",
    ),
    E(
        "samples-65-arrays",
        "samples",
        samples(lambda ctx: f.npz(**{f"a{i}": np.zeros(1) for i in range(65)})),
        422,
        "at most 64 arrays",
    ),
    E(
        "samples-claims-4gb-unpacked",
        "samples",
        samples(lambda ctx: f.npz_claiming_size()),
        422,
        "samples unpack to 4026531840 bytes",
    ),
    E("samples-empty-file", "samples", samples(lambda ctx: b""), 422, "the uploaded file is empty"),
    E(
        "samples-unknown-model",
        "samples",
        samples(lambda ctx: f.npz(input=f.images()), model_id=ID_MAX),
        404,
        f"no model with id {ID_MAX}",
    ),
    E(
        "samples-model-id-over-int32",
        "samples",
        samples(lambda ctx: f.npz(input=f.images()), model_id=HUGE_ID),
        422,
        f"less than or equal to {ID_MAX}",
    ),
]

EMPTY_PAGE = '"total":0'

QUERIES = [
    E("models-name-sql", "query", get("/v1/models", name=SQL), 200, EMPTY_PAGE),
    E("models-name-rtl", "query", get("/v1/models", name=RTL), 200, EMPTY_PAGE),
    E("models-name-emoji", "query", get("/v1/models", name=EMOJI), 200, EMPTY_PAGE),
    E("models-name-5000-chars", "query", get("/v1/models", name=HALF_LONG), 200, EMPTY_PAGE),
    E("models-name-10000-chars", "query", get("/v1/models", name=LONG), 414, LINE_TOO_LONG),
    E("models-name-nul", "query", get("/v1/models", name="resnet\x00' OR 1=1 --"), 422, "must not contain a NUL"),
    E("models-offset-over-int64", "query", get("/v1/models", offset=str(HUGE_ID)), 200, '"items":[]'),
    E("models-limit-sql", "query", get("/v1/models", limit="10; DROP TABLE models"), 422, "valid integer"),
    E("model-id-over-int32", "query", get(f"/v1/models/{HUGE_ID}"), 422, f"less than or equal to {ID_MAX}"),
    E("model-id-zero", "query", get("/v1/models/0"), 422, "greater than or equal to 1"),
    E("model-id-sql", "query", get("/v1/models/1 OR 1=1"), 422, "valid integer"),
    E("report-id-over-int32", "query", get(f"/v1/models/{HUGE_ID}/report"), 422, f"less than or equal to {ID_MAX}"),
    E("report-unknown-model", "query", get(f"/v1/models/{ID_MAX}/report"), 404, f"no model with id {ID_MAX}"),
    E("engines-model-sql", "query", get("/v1/engines", model=SQL), 200, EMPTY_PAGE),
    E("engines-cc-sql", "query", get("/v1/engines", cc="8.6' OR '1'='1"), 200, EMPTY_PAGE),
    E("engines-target-5000-chars", "query", get("/v1/engines", target=HALF_LONG), 200, EMPTY_PAGE),
    E("engines-target-10000-chars", "query", get("/v1/engines", target=LONG), 414, LINE_TOO_LONG),
    E("engines-rtl-emoji", "query", get("/v1/engines", model=RTL, backend=EMOJI), 200, EMPTY_PAGE),
    E("engines-backend-nul", "query", get("/v1/engines", backend="tensorrt\x00"), 422, "must not contain a NUL"),
    E("engines-spec-hash-nul", "query", get("/v1/engines", spec_hash="\x00" * 64), 422, "must not contain a NUL"),
    E("engines-offset-over-int64", "query", get("/v1/engines", offset=str(HUGE_ID)), 200, '"items":[]'),
    E("engine-id-over-int32", "query", get(f"/v1/engines/{HUGE_ID}"), 422, f"less than or equal to {ID_MAX}"),
    E(
        "engine-content-id-over-int32",
        "query",
        get(f"/v1/engines/{HUGE_ID}/content"),
        422,
        f"less than or equal to {ID_MAX}",
    ),
    E(
        "builds-model-id-over-int32",
        "query",
        get("/v1/builds", model_id=str(HUGE_ID)),
        422,
        f"less than or equal to {ID_MAX}",
    ),
    E("build-id-over-int32", "query", get(f"/v1/builds/{HUGE_ID}"), 422, f"less than or equal to {ID_MAX}"),
    E("sweep-id-over-int32", "query", get(f"/v1/sweeps/{HUGE_ID}"), 422, f"less than or equal to {ID_MAX}"),
    E("resolve-model-sql", "query", get("/v1/resolve", model=SQL), 404, "no model"),
    E("resolve-model-rtl", "query", get("/v1/resolve", model=RTL), 404, "no model"),
    E("resolve-model-emoji", "query", get("/v1/resolve", model=EMOJI, cc="8.6"), 404, "no model"),
    E("resolve-model-nul", "query", get("/v1/resolve", model="m\x00"), 422, "must not contain a NUL"),
    E("resolve-model-5000-chars", "query", get("/v1/resolve", model=HALF_LONG), 422, "at most 200 characters"),
    E("resolve-model-10000-chars", "query", get("/v1/resolve", model=LONG), 414, LINE_TOO_LONG),
    E(
        "resolve-version-5000-chars",
        "query",
        get("/v1/resolve", model="m", version=HALF_LONG),
        422,
        "at most 100 characters",
    ),
    E("resolve-version-nul", "query", get("/v1/resolve", model="m", version="1\x00"), 422, "must not contain a NUL"),
    E(
        "resolve-version-sql-known-model",
        "query",
        lambda ctx: Request("GET", "/v1/resolve", {"params": {"model": ctx.model_name, "version": SQL}}),
        404,
        "no model",
    ),
    E("resolve-cc-sql", "query", get("/v1/resolve", model="m", cc="8.6' OR 1=1 --"), 422, "should match pattern"),
    E("resolve-gpu-5000-chars", "query", get("/v1/resolve", model="m", gpu=HALF_LONG), 422, "at most 200 characters"),
    E("resolve-platform-rtl", "query", get("/v1/resolve", model="m", platform=RTL), 422, "should match pattern"),
    E(
        "resolve-max-latency-nan",
        "query",
        get("/v1/resolve", model="m", max_latency_ms="nan"),
        422,
        "less than or equal to 10000000",
    ),
    E("resolve-post-model-nul", "query", resolve_post(model="m\x00"), 422, "must not contain a NUL"),
    E(
        "resolve-post-unknown-field",
        "query",
        resolve_post(model="m", machine={"cc": "8.6"}),
        422,
        "['body', 'machine', 'cc']: Unexpected keyword argument",
    ),
    E(
        "resolve-post-model-lone-surrogate",
        "query",
        raw_json("/v1/resolve", lambda ctx: b'{"model": "\\ud800"}'),
        422,
        "valid string",
    ),
]

NAMES = [
    E("name-201-chars", "name", upload(f.valid_onnx, name="n" * 201), 422, "name must be 1-200"),
    E("name-10000-chars", "name", upload(f.valid_onnx, name=LONG), 422, "name must be 1-200"),
    E("name-with-slash", "name", upload(f.valid_onnx, name="team/resnet"), 422, "name must be 1-200"),
    E("name-traversal", "name", upload(f.valid_onnx, name="../../etc/passwd"), 422, "name must be 1-200"),
    E("name-empty", "name", upload(f.valid_onnx, name=""), 422, "give the model a 'name'"),
    E("name-blank", "name", upload(f.valid_onnx, name="   "), 422, "give the model a 'name'"),
    E("name-nul", "name", upload(f.valid_onnx, name="resnet\x00.onnx"), 422, "name must be 1-200"),
    E("name-rtl", "name", upload(f.valid_onnx, name=RTL), 422, "name must be 1-200"),
    E("name-emoji", "name", upload(f.valid_onnx, name=EMOJI), 422, "name must be 1-200"),
    E("name-sql", "name", upload(f.valid_onnx, name="x" + SQL), 422, "name must be 1-200"),
    E("version-with-slash", "name", upload(f.valid_onnx, version="1/../2"), 422, "version must be 1-100"),
    E("version-101-chars", "name", upload(f.valid_onnx, version="1" * 101), 422, "version must be 1-100"),
    E("version-empty", "name", upload(f.valid_onnx, version=""), 422, "version must be 1-100"),
    E("name-field-over-64k", "name", upload(f.valid_onnx, name="n" * 70_000), 422, "is longer than 65536 bytes"),
]

MULTIPART = [
    E(
        "no-closing-boundary",
        "multipart",
        raw_upload(lambda name: _multipart_head(name) + f.valid_onnx(141), _MULTIPART),
        422,
        "ends inside the 'file' part",
    ),
    E(
        "garbage-body",
        "multipart",
        raw_upload(lambda name: b"\x00\x01garbage" * 100, _MULTIPART),
        422,
        "malformed multipart body",
    ),
    E(
        "empty-boundary",
        "multipart",
        raw_upload(lambda name: _multipart_head(name) + b"x", "multipart/form-data; boundary="),
        422,
        "malformed multipart body",
    ),
    E(
        "part-without-headers",
        "multipart",
        raw_upload(lambda name: f"--{_BOUNDARY}\r\n\r\nabc\r\n--{_BOUNDARY}--\r\n".encode(), _MULTIPART),
        422,
        "the form has no 'file' part",
    ),
    E(
        "two-file-parts",
        "multipart",
        lambda ctx: Request(
            "POST",
            "/v1/models",
            {
                "data": {"name": ctx.name()},
                "files": [("file", ("a.onnx", f.valid_onnx())), ("file", ("b.onnx", f.valid_onnx(3)))],
            },
        ),
        422,
        "send one 'file' part, not several",
    ),
    E(
        "json-instead-of-form",
        "multipart",
        lambda ctx: Request("POST", "/v1/models", {"json": {"name": ctx.name()}}),
        422,
        "multipart/form-data",
    ),
]

NEEDS = "needs an API token with scope"
NOT_VALID = "the API token is not valid"
tokens_get = lambda ctx: Request("GET", "/v1/tokens")  # noqa: E731
AUTH = [
    E("upload-without-token", "auth", as_(None, upload(f.valid_onnx)), 401, f"{NEEDS} 'build'"),
    E("build-without-token", "auth", as_(None, build()), 401, f"{NEEDS} 'build'"),
    E("sweep-without-token", "auth", as_(None, sweep({"precision": ["fp32"]})), 401, f"{NEEDS} 'build'"),
    E("samples-without-token", "auth", as_(None, samples(lambda ctx: f.valid_onnx())), 401, f"{NEEDS} 'build'"),
    E("models-without-token", "auth", as_(None, get("/v1/models")), 401, f"{NEEDS} 'read'"),
    E("engines-without-token", "auth", as_(None, get("/v1/engines")), 401, f"{NEEDS} 'read'"),
    E("engine-bytes-without-token", "auth", as_(None, get("/v1/engines/1/content")), 401, f"{NEEDS} 'read'"),
    E(
        "resolve-without-token",
        "auth",
        as_(None, resolve_post(model="m", machine={"compute_capability": "8.6"})),
        401,
        f"{NEEDS} 'read'",
    ),
    E("workers-without-token", "auth", as_(None, get("/v1/workers")), 401, f"{NEEDS} 'read'"),
    E("tokens-without-token", "auth", as_(None, tokens_get), 401, f"{NEEDS} 'admin'"),
    E(
        "basic-scheme",
        "auth",
        as_("x", get("/v1/models"), header="Basic YWRtaW46YWRtaW4="),
        401,
        "must be 'Bearer <token>'",
    ),
    E("bearer-without-token", "auth", as_("x", get("/v1/models"), header="Bearer"), 401, "must be 'Bearer <token>'"),
    E(
        "token-without-scheme",
        "auth",
        as_("x", get("/v1/models"), header="ef_" + "A" * 43),
        401,
        "must be 'Bearer <token>'",
    ),
    E("unknown-token", "auth", as_("x", get("/v1/models"), header="Bearer ef_" + "A" * 43), 401, NOT_VALID),
    E("token-without-prefix", "auth", as_("x", get("/v1/models"), header="Bearer " + "A" * 43), 401, NOT_VALID),
    E("token-sql", "auth", as_("x", get("/v1/models"), header=f"Bearer ef_{SQL}"), 401, NOT_VALID),
    E("token-10000-chars", "auth", as_("x", get("/v1/models"), header="Bearer ef_" + LONG), 401, NOT_VALID),
    E("revoked-token", "auth", as_("revoked", get("/v1/models")), 401, NOT_VALID),
    E("expired-token", "auth", as_("expired", get("/v1/models")), 401, NOT_VALID),
    E(
        "read-token-uploads",
        "auth",
        as_("read", upload(f.valid_onnx)),
        403,
        "has scope 'read'; POST /v1/models needs 'build'",
    ),
    E("read-token-builds", "auth", as_("read", build()), 403, "POST /v1/builds needs 'build'"),
    E("read-token-samples", "auth", as_("read", samples(lambda ctx: f.valid_onnx())), 403, "needs 'build'"),
    E("read-token-sweeps", "auth", as_("read", sweep({"precision": ["fp32"]})), 403, "POST /v1/sweeps needs 'build'"),
    E(
        "build-token-lists-tokens",
        "auth",
        as_("build", tokens_get),
        403,
        "has scope 'build'; GET /v1/tokens needs 'admin'",
    ),
    E(
        "build-token-makes-token",
        "auth",
        as_("build", lambda ctx: Request("POST", "/v1/tokens", {"json": {"name": "escalate", "scopes": ["admin"]}})),
        403,
        "POST /v1/tokens needs 'admin'",
    ),
    E(
        "read-token-revokes-token",
        "auth",
        as_("read", lambda ctx: Request("DELETE", "/v1/tokens/1")),
        403,
        "needs 'admin'",
    ),
]

AUTH += [  # request size: a JSON body is refused once it streams past the limit (1 MiB by default)
    E(
        "build-body-2mib",
        "auth",
        raw_json("/v1/builds", lambda ctx: b'{"model_id": 1, "targets": ["' + b"x" * (2 << 20) + b'"]}'),
        413,
        "request body is over the 1048576 bytes /v1/builds takes",
    ),
    E(
        "resolve-body-2mib",
        "auth",
        raw_json("/v1/resolve", lambda ctx: b'{"model": "' + b"m" * (2 << 20) + b'"}'),
        413,
        "bytes /v1/resolve takes",
    ),
]

# Attacks kept in modules of their own, each with an ENTRIES list; imported here, after the builders they use.
from tests.corpus import admission, bodies, resolution, text, validation  # noqa: E402

CORPUS: list[Entry] = (
    ONNX
    + BUNDLES
    + EXTERNAL
    + SPECS
    + SAMPLES
    + QUERIES
    + NAMES
    + MULTIPART
    + AUTH
    + bodies.ENTRIES
    + validation.ENTRIES
    + admission.ENTRIES
    + resolution.ENTRIES
    + text.ENTRIES
)


def by_category() -> dict[str, int]:
    return dict(Counter(e.category for e in CORPUS))
