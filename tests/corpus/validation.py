"""Values that passed the checks and then misbehaved later: never-expiring tokens, odd offsets, confusable
names, reserved versions, negative dims, duplicate profiles, negative tolerances, booleans read as ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onnx import helper

from tests.corpus import PROFILE, Context, E, Entry, Request, build, ext, resolve_post, sweep, upload, with_profile
from tests.corpus import files as f

CYRILLIC_TEAM = "te\u0430m"  # the 'a' is U+0430 CYRILLIC SMALL LETTER A
FULLWIDTH_MODEL = "\uff4d\uff4f\uff44\uff45\uff4c"  # ｍｏｄｅｌ
NAME_RULE = "ASCII letters, digits"


def token(**body: Any) -> Callable[[Context], Request]:
    return lambda ctx: Request("POST", "/v1/tokens", {"json": {"name": "corpus-lifetime", "scopes": ["read"], **body}})


def upload_to(project: str) -> Callable[[Context], Request]:
    """An upload of a valid model into ``project`` (the form's project field)."""

    def make(ctx: Context) -> Request:
        return Request(
            "POST",
            "/v1/models",
            {"data": {"name": ctx.name(), "project": project}, "files": {"file": ("model.onnx", f.valid_onnx())}},
        )

    return make


def negative_output_dim() -> bytes:
    model = f.relu()
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = -4
    return model.SerializeToString()


def long_output_name() -> bytes:
    name = "o" * 1025
    return f._model(
        [helper.make_node("Relu", ["x"], [name])], [f._vi("x", [1, 4])], [f._vi(name, [1, 4])]
    ).SerializeToString()


def distinct_profiles(count: int) -> list[dict]:
    """``count`` profiles of the sample model's input that differ in their largest batch."""
    (rng,) = PROFILE[0].values()
    return [{"input": {**rng, "max": [rng["max"][0] + i, *rng["max"][1:]]}} for i in range(count)]


TOKENS = [
    E("token-expires-in-1e-300-days", "validation", token(expires_in_days=1e-300), 422, "at least 1 second"),
    E("token-expires-in-half-a-second", "validation", token(expires_in_days=0.5 / 86400), 422, "at least 1 second"),
    E("token-expires-in-true-days", "validation", token(expires_in_days=True), 422, "valid number"),
    E("token-project-confusable", "validation", token(project=CYRILLIC_TEAM), 422, "U+0430 CYRILLIC SMALL LETTER A"),
    E("token-project-fullwidth", "validation", token(project=FULLWIDTH_MODEL), 422, NAME_RULE),
]

NAMES = [
    E("upload-project-confusable", "validation", upload_to(CYRILLIC_TEAM), 422, "U+0430 CYRILLIC SMALL LETTER A"),
    E("upload-project-dotdot", "validation", upload_to(".."), 422, "starting with a letter or digit"),
    E("name-dotdot", "validation", upload(f.valid_onnx, name=".."), 422, "starting with a letter or digit"),
    E("name-dot", "validation", upload(f.valid_onnx, name="."), 422, "starting with a letter or digit"),
    E("name-leading-dash", "validation", upload(f.valid_onnx, name="-rf"), 422, "starting with a letter or digit"),
    E("name-fullwidth", "validation", upload(f.valid_onnx, name=FULLWIDTH_MODEL), 422, "U+FF4D FULLWIDTH LATIN"),
    E("name-confusable", "validation", upload(f.valid_onnx, name=CYRILLIC_TEAM), 422, NAME_RULE),
    E("version-latest", "validation", upload(f.valid_onnx, version="latest"), 422, "'latest' is reserved"),
    E("version-latest-capitalised", "validation", upload(f.valid_onnx, version="Latest"), 422, "is reserved"),
    E("version-dotdot", "validation", upload(f.valid_onnx, version=".."), 422, "starting with a letter or digit"),
    E(
        "version-fullwidth-digit",
        "validation",
        upload(f.valid_onnx, version="\uff11"),
        422,
        "U+FF11 FULLWIDTH DIGIT ONE",
    ),
]

GRAPHS = [
    E(
        "input-name-8mib",
        "validation",
        upload(lambda: f.relu(in_name="n" * (8 << 20)).SerializeToString()),
        422,
        "longer than 1024 bytes",
    ),
    E("output-name-1025-bytes", "validation", upload(long_output_name), 422, "longer than 1024 bytes"),
    E(
        "input-negative-dim",
        "validation",
        upload(lambda: f.relu(dims=(-2, 4)).SerializeToString()),
        422,
        "input 'x' declares dim -2 at axis 0",
    ),
    E("output-negative-dim", "validation", upload(negative_output_dim), 422, "output 'y' declares dim -4 at axis 1"),
    E("ext-offset-spaces", "validation", ext(offset=" 0 "), 422, "plain ASCII digits"),
    E("ext-offset-arabic-indic-digit", "validation", ext(offset="\u0660"), 422, "plain ASCII digits"),
    E("ext-offset-plus-sign", "validation", ext(offset="+0"), 422, "plain ASCII digits"),
    E("ext-length-arabic-indic-digits", "validation", ext(length=lambda size: "\u0668"), 422, "plain ASCII digits"),
]

SPECS = [
    E("profiles-2000-identical", "validation", build({"profiles": PROFILE * 2000}), 422, "profiles repeat"),
    E("profiles-two-identical", "validation", build({"profiles": PROFILE * 2}), 422, "profile 1 repeats profile 0"),
    E(
        "profiles-over-the-cap",
        "validation",
        build({"profiles": distinct_profiles(33)}),
        422,
        "at most 32 optimization profiles",
    ),
    E(
        "tolerance-negative",
        "validation",
        build(with_profile(accuracy={"tolerances": {"atol": -1e-3}})),
        422,
        "must be finite numbers >= 0",
    ),
    E(
        "tolerance-cosine-over-one",
        "validation",
        build(with_profile(accuracy={"tolerances": {"cosine": 1.5}})),
        422,
        "at most 1",
    ),
    E(
        "tolerance-as-boolean",
        "validation",
        build(with_profile(accuracy={"tolerances": {"rtol": True}})),
        422,
        "valid number",
    ),
    E("model-id-true", "validation", build(model_id=True), 422, "valid integer"),
    E("model-id-as-digit-string", "validation", build(model_id="1"), 422, "valid integer"),
    E("sweep-model-id-true", "validation", sweep({"precision": ["fp32"]}, model_id=True), 422, "valid integer"),
    E("optimization-level-true", "validation", build(with_profile(optimization_level=True)), 422, "valid integer"),
    E(
        "profile-dim-true",
        "validation",
        build({"profiles": [{"input": {**PROFILE[0]["input"], "min": [True, 3, 32, 32]}}]}),
        422,
        "valid integer",
    ),
    E(
        "fixed-input-true-for-float",
        "validation",
        build({"fixed_inputs": {"input": True}}),
        422,
        "input 'input' is FLOAT: give numbers, not true or false",
    ),
    E("queue-without-worker-as-number", "validation", build(queue_without_worker=1), 422, "valid boolean"),
    # Every dim within bounds, the tensor not: 2**20 x 3 x 32 x 32 float32 is 12 GiB for a worker to allocate.
    E(
        "profile-max-12-gib",
        "validation",
        build({"profiles": [{"input": {**PROFILE[0]["input"], "max": [1 << 20, 3, 32, 32]}}]}),
        422,
        "input 'input' at 1048576x3x32x32 (profile 0's max shapes) is 3221225472 FLOAT elements, 12 GiB: over the "
        "limit of 1 GiB a tensor (ENGINEFARM_MAX_TENSOR_BYTES)",
    ),
    E("resolve-memory-true", "validation", resolve_post(model="m", machine={"memory_mib": True}), 422, "valid integer"),
    E("resolve-explain-as-number", "validation", resolve_post(model="m", explain=1), 422, "valid boolean"),
]

ENTRIES: list[Entry] = TOKENS + NAMES + GRAPHS + SPECS
