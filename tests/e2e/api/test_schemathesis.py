"""Requests generated from the farm's own OpenAPI schema, against the real farm: no operation answers 5xx.

Every operation in /openapi.json is exercised: the coverage phase sends boundary values, missing and
invalid parameters and unexpected methods; the fuzzing phase sends MAX_EXAMPLES random requests, valid
and invalid. Generation is derandomized with a fixed seed, so a failure replays the same way. Seeded
rows (two model versions, one with samples, a finished build with its engine, a sweep) are what half the
generated ids and model names point at, so requests reach real data and not only 404s.

Besides ``not_a_server_error``, responses must match their declared schema, content type and headers, and
an operation that declares authentication must refuse a request without it. Left out, on purpose:
``status_code_conformance`` (the operations do not declare their 401/403 from the token check, nor their
404/409/413), ``negative_data_rejection`` (FastAPI ignores unknown query parameters and takes the last of
a repeated one, by design) and ``positive_data_acceptance`` (random bytes that fit the schema are still
not an ONNX model, and random strings not a target).
"""

from __future__ import annotations

import numpy as np
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    missing_required_header,
    response_headers_conformance,
    response_schema_conformance,
)

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.helpers import unique_name

SEED = 20240611
MAX_EXAMPLES = 60  # per operation, in the fuzzing phase; the coverage phase adds its own fixed set
# The server refuses a head past its bounds before any route or token check runs (414 for a request line over
# 8 KiB, 431 for the header block: server/headlimits.py), so a generated request that long and without
# its token is told that, not 401. Any other answer is judged as schemathesis judges it.
HEAD_REFUSED = {414, 431}


def missing_header_refused(ctx, response, case):
    if response.status_code in HEAD_REFUSED:
        return None
    return missing_required_header(ctx, response, case)


CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    content_type_conformance,
    response_headers_conformance,
    ignored_auth,
    missing_header_refused,
]


@pytest.fixture(scope="module")
def seeded(farm, auth_headers, tmp_path_factory) -> dict:
    """Real rows for generated requests to name, and a token of its own for DELETE /v1/tokens/{id}."""
    tmp = tmp_path_factory.mktemp("schemathesis")
    name = unique_name("fuzz")
    with Client(farm.url) as c:
        c.http.headers.update(auth_headers)
        first, _ = c.upload(save_conv_net(tmp / "v1.onnx", seed=131), name)
        second, _ = c.upload(save_conv_net(tmp / "v2.onnx", seed=132), name)
        np.savez(tmp / "samples.npz", input=np.zeros((2, 3, 32, 32), np.float32))
        c.upload_samples(first["id"], tmp / "samples.npz")
        build = c.build(first["id"], ["onnxruntime/cpu-x86_64"], sample_spec())
        build = c.wait_build(build["id"], timeout=300, poll=0.2)
        assert build["tasks"][0]["engine_id"], build
        sweep = c.sweep(first["id"], ["onnxruntime/cpu-x86_64"], {"precision": ["fp32"]}, sample_spec())
        token = c.http.post("/v1/tokens", json={"name": unique_name("fuzz"), "scopes": ["read"]})
        assert token.status_code == 201, token.text
    return {
        "name": name,
        "model": [first["id"], second["id"]],
        "build": [build["id"]],
        "engine": [build["tasks"][0]["engine_id"]],
        "sweep": [sweep["id"]],
        "token": token.json()["id"],
    }


@pytest.fixture(scope="module")
def api_schema(farm, auth_headers, seeded):
    rows = ("model", "build", "engine", "sweep")
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            # A slow machine must not fail the run: Hypothesis' timing health check says nothing about the API.
            "suppress-health-check": ["too_slow"],
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
            "dictionaries": {"name": {"values": [seeded["name"]]}, **{k: {"values": seeded[k]} for k in rows}},
            "parameters": {
                **{f"path.{k}_id": {"dictionary": k, "probability": 0.5} for k in rows},
                "query.model_id": {"dictionary": "model", "probability": 0.5},
                "body.model_id": {"dictionary": "model", "probability": 0.5},
                "query.model": {"dictionary": "name", "probability": 0.5},
                "query.name": {"dictionary": "name", "probability": 0.5},
                "body.model": {"dictionary": "name", "probability": 0.5},
                # Revocation only ever aims at the token made for it, never at the session's own.
                "path.token_id": seeded["token"],
            },
        }
    )
    return schemathesis.openapi.from_url(f"{farm.url}/openapi.json", config=config, headers=auth_headers)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(autouse=True)
def _node_id_for_subtests(request):
    """The lazy schema renames the test per operation through ``node._nodeid``, which pytest 9 no longer has."""
    request.node._nodeid = request.node.nodeid


@schema.parametrize()
def test_no_server_errors(case, auth_headers):
    case.call_and_validate(headers=auth_headers, checks=CHECKS, timeout=60)


def test_sweep_size_is_checked_before_its_combinations_are_made(farm, auth_headers, seeded):
    """Five axes of 100 values are 10^10 variants: refused at once, not enumerated until memory runs out."""
    axes = {
        k: list(range(100))
        for k in ("precision", "optimization_level", "profiles", "hardware_compatibility", "strongly_typed")
    }
    with Client(farm.url) as c:
        c.http.headers.update(auth_headers)
        r = c.http.post(
            "/v1/sweeps",
            json={"model_id": seeded["model"][0], "targets": ["onnxruntime/cpu-x86_64"], "axes": axes},
            timeout=10,
        )
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == "the sweep has 10000000000 variants; at most 64"
