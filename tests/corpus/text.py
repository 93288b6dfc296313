"""Text the catalog cannot store (NUL, a lone surrogate) in every field that reaches it: the machine's GPU name and
OS in every form of resolve (query, JSON body, the dashboard's form and its pasted probe), model names and
versions, token names, uploads' fields; and the dashboard's forms written wrong (a pasted probe of the wrong shape,
a workspace size of 400 digits). Each is a 4xx that says what is wrong, never a 500 from the database."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from api.ui.session import COOKIE, csrf_token
from tests.corpus import Context, E, Entry, Request, resolve_post, upload
from tests.corpus import files as f

NUL = "must not contain a NUL"
SURROGATE = "must not contain a lone surrogate"
PROBE = {
    "hostname": "edge-1",
    "platform": "x86_64",
    "os": "Linux",
    "driver_version": "580.65",
    "cuda_version": "13.0",
    "jetson": None,
    "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9", "memory_mib": 24564}],
    "modules": {"tensorrt_rtx": "1.7.1.116"},
}


def resolve_query(**params: Any) -> Callable[[Context], Request]:
    return lambda ctx: Request("GET", "/v1/resolve", {"params": {"model": ctx.model_name, **params}})


def raw_resolve(body: str) -> Callable[[Context], Request]:
    """A resolve body written by hand, for escapes (``\\ud800``) a JSON encoder will not write."""
    return lambda ctx: Request(
        "POST",
        "/v1/resolve",
        {"content": body.replace("MODEL", ctx.model_name).encode(), "headers": {"content-type": "application/json"}},
    )


def _dashboard(ctx: Context, scope: str) -> dict[str, str]:
    """Headers of a signed-in dashboard request: any API token works as the session cookie."""
    return {"Cookie": f"{COOKIE}={ctx.tokens[scope]}", "Accept": "application/json"}


def ui_resolve_get(**params: Any) -> Callable[[Context], Request]:
    return lambda ctx: Request(
        "GET", "/ui/resolve", {"params": {"model": ctx.model_name, **params}, "headers": _dashboard(ctx, "read")}
    )


def ui_resolve(**form: Any) -> Callable[[Context], Request]:
    def make(ctx: Context) -> Request:
        data = {"model": ctx.model_name, "csrf": csrf_token(ctx.tokens["read"]), **form}
        return Request("POST", "/ui/resolve", {"data": data, "headers": _dashboard(ctx, "read")})

    return make


def probe(**changes: Any) -> str:
    return json.dumps({**PROBE, **changes})


def ui_build(trtexec: str = "", **fields: str) -> Callable[[Context], Request]:
    def make(ctx: Context) -> Request:
        data = {
            "csrf": csrf_token(ctx.tokens["build"]),
            "targets": "tensorrt-rtx/sm86",
            "precision": "fp32",
            "trtexec": trtexec,
            **fields,
        }
        return Request("POST", f"/ui/models/{ctx.model_id}/builds", {"data": data, "headers": _dashboard(ctx, "build")})

    return make


def token_named(name: str) -> Callable[[Context], Request]:
    return raw_token('{"name": "%s", "scopes": ["read"]}' % name)


def raw_token(body: str) -> Callable[[Context], Request]:
    return lambda ctx: Request(
        "POST", "/v1/tokens", {"content": body.encode(), "headers": {"content-type": "application/json"}}
    )


DEEP = "[" * 100_000 + "]" * 100_000

ENTRIES: list[Entry] = [
    # resolve, every form: the GPU name is looked up in the catalog (the latency measured on that GPU model)
    E("resolve-gpu-nul", "text", resolve_query(gpu="RTX\x004090"), 422, NUL),
    E("resolve-os-nul", "text", resolve_query(os="Linux\x00"), 422, NUL),
    E("resolve-post-gpu-nul", "text", resolve_post(model="m", machine={"gpu_name": "RTX\x004090"}), 422, NUL),
    E("resolve-post-os-nul", "text", resolve_post(model="m", machine={"os": "\x00"}), 422, NUL),
    E(
        "resolve-post-gpu-surrogate",
        "text",
        raw_resolve('{"model": "MODEL", "machine": {"gpu_name": "RTX \\ud800"}}'),
        422,
        SURROGATE,
    ),
    # FastAPI's JSON parsing of a model's own fields refuses a lone surrogate itself.
    E("resolve-post-model-surrogate", "text", raw_resolve('{"model": "\\udfff"}'), 422, "valid string"),
    E("resolve-post-version-nul", "text", raw_resolve('{"model": "MODEL", "version": "1\\u0000"}'), 422, NUL),
    E("ui-resolve-query-gpu-nul", "text", ui_resolve_get(gpu="RTX\x004090"), 422, NUL),
    E("ui-resolve-query-gpu-name-nul", "text", ui_resolve_get(gpu_name="RTX\x004090", cc="8.9"), 422, NUL),
    E("ui-resolve-gpu-nul", "text", ui_resolve(gpu_name="RTX\x004090"), 422, NUL),
    E("ui-resolve-model-nul", "text", ui_resolve(model="m\x00"), 422, NUL),
    E(
        "ui-resolve-probe-gpu-nul",
        "text",
        ui_resolve(probe=probe(gpus=[{**PROBE["gpus"][0], "name": "RTX\x004090"}])),
        422,
        NUL,
    ),
    E(
        "ui-resolve-probe-os-surrogate",
        "text",
        ui_resolve(probe=probe().replace('"Linux"', '"\\ud800"')),
        422,
        SURROGATE,
    ),
    E("ui-resolve-fingerprint-gpu-nul", "text", ui_resolve(probe=json.dumps({"gpu_name": "RTX\x004090"})), 422, NUL),
    # the pasted probe, of the wrong shape
    E("ui-resolve-probe-modules-list", "text", ui_resolve(probe=probe(modules=["tensorrt_rtx"])), 422, "modules"),
    E("ui-resolve-probe-modules-string", "text", ui_resolve(probe=probe(modules="tensorrt_rtx")), 422, "modules"),
    E("ui-resolve-probe-gpus-object", "text", ui_resolve(probe=probe(gpus={"0": "RTX"})), 422, "gpus"),
    E("ui-resolve-probe-gpu-not-object", "text", ui_resolve(probe=probe(gpus=["RTX 4090"])), 422, "gpus"),
    E("ui-resolve-probe-jetson-list", "text", ui_resolve(probe=probe(jetson=[1])), 422, "jetson"),
    E(
        "ui-resolve-probe-nested-100000",
        "text",
        ui_resolve(probe=DEEP[:50_000] + DEEP[-50_000:]),
        422,
        "nested more than",
    ),
    E(
        "ui-resolve-probe-nested-in-a-field",
        "text",
        ui_resolve(probe=probe().replace('"edge-1"', "[" * 20 + "]" * 20)),
        422,
        "nested more than",
    ),
    E("ui-resolve-probe-not-an-object", "text", ui_resolve(probe="[1, 2]"), 422, "must be a JSON object"),
    E("ui-resolve-probe-not-json", "text", ui_resolve(probe="{gpus: 1"), 422, "not JSON"),
    # overflowing numbers on the dashboard's build form
    E(
        "ui-build-workspace-400-digits",
        "text",
        ui_build("--memPoolSize=workspace:" + "9" * 400),
        422,
        "--memPoolSize=workspace:",
    ),
    E(
        "ui-build-workspace-400-digits-gib",
        "text",
        ui_build("--memPoolSize=workspace:" + "9" * 300 + "G"),
        422,
        "give e.g. 4096M or 4G",
    ),
    E(
        "ui-build-workspace-over-1tib",
        "text",
        ui_build("--memPoolSize=workspace:2048G"),
        422,
        "the largest workspace a build may ask for",
    ),
    E(
        "ui-build-opt-level-5000-digits",
        "text",
        ui_build("--builderOptimizationLevel=" + "3" * 5000),
        422,
        "give a level from 0 to 5",
    ),
    E(
        "ui-build-opt-level-superscript",
        "text",
        ui_build("--builderOptimizationLevel=\u00b2"),
        422,
        "give a level from 0 to 5",
    ),
    E(
        "ui-build-dims-400-digits",
        "text",
        ui_build(
            dynamic="input", **{"min:input": "1x3x32x32", "opt:input": "1x3x32x32", "max:input": "9" * 400 + "x3x32x32"}
        ),
        422,
        "has a dim outside 1..1048576",
    ),
    E(
        "ui-build-dims-5000-digits",
        "text",
        ui_build(
            dynamic="input",
            **{"min:input": "1x3x32x32", "opt:input": "1x3x32x32", "max:input": "9" * 5000 + "x3x32x32"},
        ),
        422,
        "write dims as 1x3x224x224",
    ),
    E(
        "ui-build-trtexec-shapes-400-digits",
        "text",
        ui_build("--minShapes=input:1x3x32x32 --optShapes=input:1x3x32x32 --maxShapes=input:" + "9" * 400 + "x3x32x32"),
        422,
        "outside 1..1048576",
    ),
    # names that reach the catalog
    E("token-name-nul", "text", token_named("corpus\\u0000"), 422, NUL),
    E("token-name-surrogate", "text", token_named("corpus\\ud800"), 422, "valid string"),
    E("upload-version-nul", "text", upload(f.valid_onnx, version="1\x00"), 422, "version must be 1-"),
    E("upload-name-nul-short", "text", upload(f.valid_onnx, name="m\x00"), 422, "name must be 1-200"),
]
