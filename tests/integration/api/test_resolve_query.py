"""GET /v1/resolve's query is derived from POST's body: one model of the filters (``Wanted``), one of the machine,
so a new filter or constraint reaches both spellings at once and both ask the same question."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.schemas.resolve import SHAPE_PARAMETERS, ResolveQuery, ResolveRequest, request_of
from api.services.answers import digest_of
from enginefarm.core.machine import SHORT_NAMES, Machine
from enginefarm.core.wanted import Wanted


def test_every_filter_and_machine_field_is_a_query_parameter_with_its_constraints():
    query = ResolveQuery.model_fields
    for name, info in Wanted.model_fields.items():
        assert query[name].metadata == [m for m in info.metadata if type(m).__name__ != "Strict"], name
        assert query[name].description == info.description
    machine = {SHORT_NAMES.get(n, n) for n in Machine.__pydantic_fields__} - {"shapes"}
    assert set(query) == set(ResolveRequest.model_fields) - {"machine"} | machine | set(SHAPE_PARAMETERS)


def test_a_get_asks_the_same_question_as_its_post():
    posted = ResolveRequest.model_validate(
        {
            "model": "yolo",
            "version": "latest",
            "machine": {
                "compute_capability": "8.6",
                "trt_rtx_version": "1.7.1.116",
                "memory_mib": 24576,
                "lean_runtime": True,
                "shapes": {"images": [1, 3, 640, 640]},
                "precisions": ["fp16", "fp32"],
            },
            "max_latency_ms": 5,
            "accept": ["cpu", "failed"],
            "explain": True,
        }
    )
    query = ResolveQuery.model_validate(
        {
            "model": "yolo",
            "version": "latest",
            "cc": "8.6",
            "trt_rtx": "1.7.1.116",
            "memory_mib": "24576",
            "lean": "true",
            "shapes": "images:1x3x640x640",
            "precisions": ["fp16,fp32"],
            "max_latency_ms": "5",
            "accept": ["cpu", "failed"],
            "explain": "1",
        }
    )
    asked = request_of(query)
    assert asked == posted
    assert digest_of(asked) == digest_of(posted)


@pytest.mark.parametrize(
    "body, words",
    [
        ({"model": "m", "explain": 1}, "valid boolean"),
        ({"model": "m", "max_latency_ms": "5"}, "valid number"),
        ({"model": "m", "machine": {"memory_mib": True}}, "valid integer"),
    ],
)
def test_the_json_body_stays_strict_where_the_query_string_is_text(body, words):
    with pytest.raises(ValidationError, match=words):
        ResolveRequest.model_validate(body)


@pytest.mark.parametrize(
    "params, where",
    [({"cc": "86"}, "cc"), ({"precision": "int4"}, "precision"), ({"accept": ["maybe"]}, "accept"), ({}, "model")],
)
def test_a_bad_query_parameter_is_named_as_the_query_names_it(params, where):
    with pytest.raises(ValidationError) as caught:
        ResolveQuery.model_validate({"model": "m", **params} if where != "model" else params)
    assert caught.value.errors()[0]["loc"][0] == where


def test_an_unknown_query_parameter_is_refused_with_the_one_meant(tmp_path):
    """A misspelt filter or a long field name would be ignored and change the answer without a word
    (trt_version=10.3.0 served a TensorRT-RTX engine to a TensorRT machine): a 422 names it and the one meant."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from enginefarm.core.config import Settings
    from server.embedded import issue_token

    settings = Settings(data_dir=tmp_path, reconcile_seconds=0, gc_interval_seconds=0)
    with TestClient(create_app(settings)) as http:
        http.headers["Authorization"] = f"Bearer {issue_token(settings, 'query', ['read'])}"
        params = {"model": "m", "cc": "8.6", "trt_version": "10.3.0", "precison": "int8"}
        refused = http.get("/v1/resolve", params=params)
        assert refused.status_code == 422, refused.text
        said = {e["loc"][1]: e["msg"] for e in refused.json()["detail"]}
        assert said["trt_version"].endswith("did you mean trt?")
        assert said["precison"].endswith("did you mean precision?")
        assert "unknown query parameter 'precison'" in said["precison"]
        assert http.get("/v1/resolve", params={"model": "m", "cc": "8.6", "trt": "10.3.0"}).status_code == 404
