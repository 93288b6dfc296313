"""What a deploy machine says it will run, written wrong: trtexec shapes that do not parse or cannot exist, shape
ranges upside down, precisions and acceptances the farm does not know. Each is a 422 that names the fault."""

from __future__ import annotations

from tests.corpus import LINE_TOO_LONG, LONG, E, Entry, get, resolve_post

SHAPE_HINT = "write shapes as trtexec does"

ENTRIES: list[Entry] = [
    E(
        "resolve-shapes-not-integers",
        "query",
        get("/v1/resolve", model="m", shapes="input:1x3xbig"),
        422,
        "dims must be integers separated by 'x'",
    ),
    E("resolve-shapes-nan-dim", "query", get("/v1/resolve", model="m", shapes="input:nanx3x32x32"), 422, SHAPE_HINT),
    E("resolve-shapes-no-name", "query", get("/v1/resolve", model="m", shapes="1x3x32x32"), 422, "must be NAME:DxDxD"),
    E(
        "resolve-shapes-zero-dim",
        "query",
        get("/v1/resolve", model="m", shapes="input:0x3x32x32"),
        422,
        "each a whole number within 1..1048576",
    ),
    E(
        "resolve-shapes-negative-dim",
        "query",
        get("/v1/resolve", model="m", shapes="input:-1x3x32x32"),
        422,
        "each a whole number within 1..1048576",
    ),
    E(
        "resolve-shapes-huge-dim",
        "query",
        get("/v1/resolve", model="m", shapes="input:99999999999999999999x3"),
        422,
        "each a whole number within 1..1048576",
    ),
    E(
        "resolve-shapes-17-dims",
        "query",
        get("/v1/resolve", model="m", shapes="input:" + "x".join(["1"] * 17)),
        422,
        "at most 16 dims",
    ),
    E(
        "resolve-shapes-10001-chars",
        "query",
        get("/v1/resolve", model="m", shapes=LONG + "x"),
        414,  # the app's own 10,000-character bound on shapes is past the server's 8 KiB request line
        LINE_TOO_LONG,
    ),
    E(
        "resolve-min-shapes-without-max",
        "query",
        get("/v1/resolve", model="m", min_shapes="input:1x3x32x32"),
        422,
        "need both --minShapes and --maxShapes",
    ),
    E(
        "resolve-shapes-min-above-max",
        "query",
        get("/v1/resolve", model="m", min_shapes="input:8x3x32x32", max_shapes="input:1x3x32x32"),
        422,
        "need min <= opt <= max",
    ),
    E(
        "resolve-shapes-ranks-differ",
        "query",
        get("/v1/resolve", model="m", min_shapes="input:1x3", max_shapes="input:1x3x32x32"),
        422,
        "min, opt and max need the same number of dims",
    ),
    E(
        "resolve-shapes-given-twice",
        "query",
        get(
            "/v1/resolve",
            model="m",
            shapes="input:1x3x32x32",
            min_shapes="input:1x3x32x32",
            max_shapes="input:4x3x32x32",
        ),
        422,
        "give each once",
    ),
    E(
        "resolve-precisions-unknown",
        "query",
        get("/v1/resolve", model="m", precisions="int4"),
        422,
        "'fp32', 'fp16', 'bf16', 'int8' or 'fp8'",
    ),
    E(
        "resolve-accept-unknown",
        "query",
        get("/v1/resolve", model="m", accept="everything"),
        422,
        "'unchecked', 'failed' or 'cpu'",
    ),
    E(
        "resolve-backend-unknown",
        "query",
        get("/v1/resolve", model="m", backend="tensorflow"),
        422,
        "should match pattern",
    ),
    E(
        "resolve-post-accept-unknown",
        "query",
        resolve_post(model="m", accept=["all"]),
        422,
        "'unchecked', 'failed' or 'cpu'",
    ),
    E("resolve-post-accept-not-a-list", "query", resolve_post(model="m", accept="unchecked"), 422, "valid list"),
    E(
        "resolve-post-precisions-unknown",
        "query",
        resolve_post(model="m", machine={"precisions": ["int4"]}),
        422,
        "'fp32', 'fp16', 'bf16', 'int8' or 'fp8'",
    ),
    E(
        "resolve-post-shapes-negative",
        "query",
        resolve_post(model="m", machine={"shapes": {"input": [-1, 3]}}),
        422,
        "each a whole number within 1..1048576",
    ),
    E(
        "resolve-post-shapes-bool-dim",
        "query",
        resolve_post(model="m", machine={"shapes": {"input": [True, 3]}}),
        422,
        "each a whole number within 1..1048576",
    ),
    E(
        "resolve-post-shapes-string",
        "query",
        resolve_post(model="m", machine={"shapes": {"input": "1x3x32x32"}}),
        422,
        "give dims, or min, max (and opt) dims",
    ),
    E(
        "resolve-post-shapes-unknown-key",
        "query",
        resolve_post(model="m", machine={"shapes": {"input": {"min": [1], "max": [2], "best": [1]}}}),
        422,
        "give dims, or min, max (and opt) dims",
    ),
    E(
        "resolve-post-shapes-opt-outside",
        "query",
        resolve_post(model="m", machine={"shapes": {"input": {"min": [1, 3], "opt": [9, 3], "max": [4, 3]}}}),
        422,
        "need min <= opt <= max",
    ),
]
