"""What the farm would refuse only after the last byte of an upload, the client refuses before the first: a token
that may not upload (read scope), a project's token naming another project, and form fields the farm does not take.
Against the session's farm (a real API process), with a model larger than one chunk so that a byte sent would show.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from enginefarm.client import Client
from enginefarm.core.errors import Forbidden, ModelRejected, Unauthorized
from enginefarm.graph.samples import save_conv_net
from server.embedded import issue_token
from tests.helpers import unique_name


@pytest.fixture
def big_model(tmp_path) -> Path:
    path = tmp_path / "big.onnx"
    path.write_bytes(b"\0" * (4 << 20))  # never read: every upload here is refused before its body
    return path


def _refused(farm, token: str | None, path: Path, **kw) -> tuple[Exception, list[int]]:
    sent: list[int] = []
    with Client(farm.url, token=token) as client, pytest.raises(Exception) as caught:
        client.upload(path, on_bytes=sent.append, **kw)
    return caught.value, sent


def test_a_read_token_is_refused_before_a_byte_is_sent(farm, dist_settings, big_model):
    token = issue_token(dist_settings, unique_name("reader"), ["read"])
    error, sent = _refused(farm, token, big_model, name=unique_name("big"))
    assert isinstance(error, Forbidden), error
    assert "has scope 'read'; POST /v1/models needs 'build'" in str(error)
    assert sum(sent) == 0


def test_no_token_is_refused_naming_what_an_upload_needs_and_the_clis_way(farm, big_model, monkeypatch):
    """Not the scope of the lookup that found no token ('read'), nor an HTTP header: the scope an upload needs and
    how a CLI user gives a token."""
    monkeypatch.delenv("ENGINEFARM_TOKEN", raising=False)
    error, sent = _refused(farm, None, big_model, name=unique_name("big"))
    assert isinstance(error, Unauthorized), error
    assert "scope 'build'" in str(error) and "ENGINEFARM_TOKEN or pass --token" in str(error)
    assert sum(sent) == 0


def test_a_projects_token_naming_another_project_is_refused_before_a_byte_is_sent(farm, dist_settings, big_model):
    token = issue_token(dist_settings, unique_name("team"), ["build"], project="team-a")
    error, sent = _refused(farm, token, big_model, name=unique_name("big"), project="team-b")
    assert isinstance(error, Forbidden), error
    assert "belongs to project 'team-a'; it cannot upload to project 'team-b'" in str(error)
    assert sum(sent) == 0


@pytest.mark.parametrize(
    "fields, where",
    [
        ({"name": "bad/name"}, "name"),
        ({"name": "ok", "version": "latest"}, "version"),
        ({"name": "ok", "project": "a b"}, "project"),
    ],
)
def test_form_fields_the_farm_refuses_are_refused_before_a_byte_is_sent(farm, big_model, fields, where):
    error, sent = _refused(farm, farm.token, big_model, **fields)
    assert isinstance(error, ModelRejected), error
    assert error.status_code == 422 and [p["loc"] for p in error.problems] == [[where]]
    assert sum(sent) == 0


def test_an_allowed_upload_still_goes_through(farm, dist_settings, tmp_path):
    token = issue_token(dist_settings, unique_name("builder"), ["build"], project="team-c")
    path = save_conv_net(tmp_path / "small.onnx", channels=4, blocks=1, seed=41)
    with Client(farm.url, token=token) as client:
        model, created = client.upload(path, name=unique_name("small"))
    assert created and model["project"] == "team-c"


def test_what_the_farm_takes_is_not_refused(farm, dist_settings, tmp_path):
    """Bytes the farm holds under the name come back to any token that may read them (nothing is sent); an empty
    version or project is left out of the form, as it always was, not refused."""
    path = save_conv_net(tmp_path / "held.onnx", channels=4, blocks=1, seed=43)
    name = unique_name("held")
    builder = issue_token(dist_settings, unique_name("builder"), ["build"], project="team-d")
    with Client(farm.url, token=builder) as client:
        first, created = client.upload(path, name=name, version="", project="")
    assert created and first["project"] == "team-d" and first["version"] == "1"
    reader = issue_token(dist_settings, unique_name("reader"), ["read"], project="team-d")
    with Client(farm.url, token=reader) as client:
        again, created = client.upload(path, name=name, project="team-d")
    assert not created and again["id"] == first["id"]


def test_the_current_token_says_what_it_may_do(farm, dist_settings):
    token = issue_token(dist_settings, "who", ["read"], project="team-a")
    me = httpx.get(f"{farm.url}/v1/tokens/current", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert me.status_code == 200, me.text
    assert me.json() | {"expires_at": None} == {"name": "who", "scope": "read", "project": "team-a", "expires_at": None}
    anonymous = httpx.get(f"{farm.url}/v1/tokens/current", timeout=30)
    assert anonymous.status_code == 401
    with Client(farm.url, token="ef_not-a-token") as client, pytest.raises(Unauthorized):
        client.get("/v1/tokens/current")
