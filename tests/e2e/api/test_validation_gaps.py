"""Values the farm once accepted and then misbehaved on, refused on the real farm where they first come in: token
lifetimes under a second, non-ASCII or dot names for projects, models and versions, the reserved version 'latest',
booleans and strings where JSON ids and numbers belong, repeated or too many profiles, odd tolerances. Each answer
is a 422 naming the field (``loc``) and what to give instead, and nothing is written."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from enginefarm.core.errors import SpecInvalid
from enginefarm.graph.samples import conv_net, sample_spec
from storage.db import session_scope
from storage.tables import ApiTokenRow
from storage.tokens import create_token
from tests.helpers import unique_name

PROFILE = sample_spec()["profiles"]
CYRILLIC_TEAM = "te\u0430m"
NO_CHECKS = {"benchmark": {"enabled": False}, "accuracy": {"enabled": False}}


def problems(response: httpx.Response) -> list[tuple[list, str]]:
    """(loc, msg) of every problem: request validation's detail list, or the farm's own problems."""
    body = response.json()
    listed = body["detail"] if isinstance(body.get("detail"), list) else body.get("problems", [])
    return [(p["loc"], p["msg"]) for p in listed]


def only_problem(response: httpx.Response) -> tuple[list, str]:
    assert response.status_code == 422, response.text
    found = problems(response)
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def model_id(farm) -> int:
    with httpx.Client(base_url=farm.url, timeout=60, headers=farm.headers) as c:
        r = c.post(
            "/v1/models",
            data={"name": unique_name("gaps")},
            files={"file": ("m.onnx", conv_net(seed=5151).SerializeToString())},
        )
        assert r.status_code == 201, r.text
        return r.json()["id"]


def _token_count(settings) -> int:
    with session_scope(settings) as s:
        return s.query(ApiTokenRow).count()


@pytest.mark.parametrize("days", [1e-300, 1e-9, 0.5 / 86400, 0, -1])
def test_token_lifetime_under_a_second_is_refused(api, dist_settings, days):
    before = _token_count(dist_settings)
    r = api.post("/v1/tokens", json={"name": unique_name("short"), "scopes": ["read"], "expires_in_days": days})
    loc, msg = only_problem(r)
    assert loc == ["body", "expires_in_days"]
    assert "at least 1 second" in msg and "1.16e-05 days" in msg, msg
    assert _token_count(dist_settings) == before


def test_token_of_one_second_expires(api):
    r = api.post("/v1/tokens", json={"name": unique_name("brief"), "scopes": ["read"], "expires_in_days": 1 / 86400})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["expires_at"] is not None and body["expires_at"] > body["created_at"]


def test_create_token_refuses_an_expiry_not_in_the_future(dist_settings):
    with session_scope(dist_settings) as s:
        for lifetime in (timedelta(0), timedelta(days=1e-300), timedelta(seconds=-5)):
            with pytest.raises(SpecInvalid, match="must be in the future"):
                create_token(s, unique_name("zero"), ["read"], lifetime)


@pytest.mark.parametrize(
    "project, says",
    [
        (CYRILLIC_TEAM, "U+0430 CYRILLIC SMALL LETTER A"),
        ("\uff54\uff45\uff41\uff4d", "U+FF54 FULLWIDTH LATIN SMALL LETTER T"),
        ("..", "starting with a letter or digit"),
    ],
)
def test_project_names_follow_one_ascii_rule_for_uploads_and_tokens(api, project, says):
    made = api.post("/v1/tokens", json={"name": unique_name("p"), "scopes": ["build"], "project": project})
    loc, token_msg = only_problem(made)
    assert loc == ["body", "project"] and says in token_msg, token_msg

    name = unique_name("p")
    up = api.post(
        "/v1/models",
        data={"name": name, "project": project},
        files={"file": ("m.onnx", conv_net(seed=5152).SerializeToString())},
    )
    loc, upload_msg = only_problem(up)
    assert loc == ["project"] and says in upload_msg, upload_msg
    assert "ASCII letters, digits, '-', '_' or '.'" in upload_msg
    assert token_msg.removeprefix("Value error, ") == upload_msg  # one rule, one wording
    assert api.get("/v1/models", params={"name": name}).json()["total"] == 0


@pytest.mark.parametrize(
    "name, version, where, says",
    [
        ("..", None, "name", "starting with a letter or digit"),
        (".", None, "name", "starting with a letter or digit"),
        (".hidden", None, "name", "starting with a letter or digit"),
        ("-rf", None, "name", "starting with a letter or digit"),
        ("\uff4d\uff4f\uff44\uff45\uff4c", None, "name", "U+FF4D FULLWIDTH LATIN SMALL LETTER M"),
        ("mod\u00e8le", None, "name", "U+00E8 LATIN SMALL LETTER E WITH GRAVE"),
        (None, "latest", "version", "'latest' is reserved"),
        (None, "LATEST", "version", "is reserved"),
        (None, "..", "version", "starting with a letter or digit"),
        (None, "-1", "version", "starting with a letter or digit"),
        (None, "\uff11", "version", "U+FF11 FULLWIDTH DIGIT ONE"),
    ],
)
def test_model_names_and_versions_are_ascii_and_not_selectors(api, name, version, where, says):
    name = name or unique_name("v")
    data = {"name": name, **({"version": version} if version is not None else {})}
    r = api.post("/v1/models", data=data, files={"file": ("m.onnx", conv_net(seed=5153).SerializeToString())})
    loc, msg = only_problem(r)
    assert loc == [where] and says in msg, msg
    assert api.get("/v1/models", params={"name": name}).json()["total"] == 0


def test_allowed_names_still_upload(api):
    name = unique_name("ok_Name.v2")
    r = api.post(
        "/v1/models",
        data={"name": name, "version": "1.0+cu12_b-3"},
        files={"file": ("m.onnx", conv_net(seed=5154).SerializeToString())},
    )
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "url, body, where, says",
    [
        ("/v1/builds", {"model_id": True}, ["body", "model_id"], "valid integer"),
        ("/v1/builds", {"model_id": "MID"}, ["body", "model_id"], "valid integer"),
        ("/v1/sweeps", {"model_id": True, "axes": {"precision": ["fp32"]}}, ["body", "model_id"], "valid integer"),
        ("/v1/builds", {"queue_without_worker": 1}, ["body", "queue_without_worker"], "valid boolean"),
        (
            "/v1/builds",
            {"spec": {"profiles": PROFILE, "optimization_level": True}},
            ["body", "spec", "optimization_level"],
            "valid integer",
        ),
        (
            "/v1/builds",
            {"spec": {"profiles": PROFILE, "benchmark": {"iterations": True}}},
            ["body", "spec", "benchmark", "iterations"],
            "valid integer",
        ),
        (
            "/v1/builds",
            {"spec": {"profiles": PROFILE, "accuracy": {"tolerances": {"rtol": True}}}},
            ["body", "spec", "accuracy", "tolerances", "rtol"],
            "valid number",
        ),
        (
            "/v1/builds",
            {"spec": {"profiles": [{"input": {**PROFILE[0]["input"], "max": [True, 3, 32, 32]}}]}},
            ["body", "spec", "profiles", 0, "input", "max", 0],
            "valid integer",
        ),
    ],
)
def test_booleans_and_strings_are_not_numbers(api, model_id, url, body, where, says):
    payload = {"model_id": model_id, "targets": ["onnxruntime/cpu-x86_64"], "spec": {"profiles": PROFILE}, **body}
    if payload["model_id"] == "MID":
        payload["model_id"] = str(model_id)
    before = len(api.get("/v1/builds", params={"model_id": model_id}).json())
    loc, msg = only_problem(api.post(url, json=payload))
    assert loc == where and says in msg, (loc, msg)
    assert len(api.get("/v1/builds", params={"model_id": model_id}).json()) == before


@pytest.mark.parametrize(
    "body, where, says",
    [
        ({"machine": {"memory_mib": True}}, ["body", "machine", "memory_mib"], "valid integer"),
        ({"machine": {"lean_runtime": 1}}, ["body", "machine", "lean_runtime"], "valid boolean"),
        ({"explain": 1}, ["body", "explain"], "valid boolean"),
        ({"max_latency_ms": True}, ["body", "max_latency_ms"], "valid number"),
    ],
)
def test_resolve_takes_json_types_as_they_are(api, body, where, says):
    loc, msg = only_problem(api.post("/v1/resolve", json={"model": "m", **body}))
    assert loc == where and says in msg, (loc, msg)


def _build(api, model_id, spec):
    return api.post("/v1/builds", json={"model_id": model_id, "targets": ["onnxruntime/cpu-x86_64"], "spec": spec})


def test_repeated_and_too_many_profiles_are_refused(api, model_id):
    loc, msg = only_problem(_build(api, model_id, {"profiles": PROFILE * 2000}))
    assert loc == ["body", "spec", "profiles"] and "profiles repeat" in msg and "profile 1 repeats profile 0" in msg, (
        msg
    )

    (rng,) = PROFILE[0].values()
    distinct = [{"input": {**rng, "max": [rng["max"][0] + i, *rng["max"][1:]]}} for i in range(33)]
    loc, msg = only_problem(_build(api, model_id, {"profiles": distinct}))
    assert loc == ["body", "spec", "profiles"] and "at most 32 optimization profiles" in msg and "33" in msg, msg

    assert _build(api, model_id, {"profiles": distinct[:2], **NO_CHECKS}).status_code == 202


@pytest.mark.parametrize(
    "tolerances, says",
    [
        ({"atol": -1e-3}, "'atol'"),
        ({"rel_l2": -0.5, "rtol": -1}, "'rel_l2'"),
        ({"cosine": 1.5}, "at most 1"),
        ({"violations": 2}, "at most 1"),
        ({"agreement": 1.01}, "at most 1"),
    ],
)
def test_tolerances_outside_their_range_are_refused(api, model_id, tolerances, says):
    loc, msg = only_problem(_build(api, model_id, {"profiles": PROFILE, "accuracy": {"tolerances": tolerances}}))
    assert loc == ["body", "spec", "accuracy", "tolerances"] and says in msg, (loc, msg)
