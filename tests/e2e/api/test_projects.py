"""Projects (tenants) on the real farm: a token of a project sees and builds only that project's models and
their engines, builds, sweeps and reports; names and versions are per project; one project's ids are 404
to another, as if they did not exist; an admin of the whole farm sees every project."""

from __future__ import annotations

import uuid

import httpx
import pytest

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.e2e.api.test_auth import bearer, cli
from tests.helpers import unique_name

CPU = "onnxruntime/cpu-x86_64"
NO_CHECKS = {"benchmark": {"enabled": False}, "accuracy": {"enabled": False}}
MACHINE = {"gpu_name": None, "compute_capability": None, "platform": "x86_64"}


@pytest.fixture(scope="module")
def projects(farm):
    """Two projects, each with a build token and a read token; returns {project: {"build": t, "read": t}}."""
    suffix = uuid.uuid4().hex[:6]
    out = {}
    for name in (f"alpha-{suffix}", f"beta-{suffix}"):
        out[name] = {}
        for scope in ("build", "read"):
            made = httpx.post(
                f"{farm.url}/v1/tokens",
                headers=farm.headers,
                timeout=30,
                json={"name": f"{name}-{scope}", "scopes": [scope], "project": name},
            )
            assert made.status_code == 201, made.text
            assert made.json()["project"] == name
            out[name][scope] = made.json()["token"]
    return out


def test_a_project_sees_only_its_own_models_and_engines(farm, api, projects, tmp_path):
    alpha, beta = projects
    name = unique_name("shared-name")  # both projects use it: names are per project
    with Client(farm.url, token=projects[alpha]["build"]) as a, Client(farm.url, token=projects[beta]["build"]) as b:
        ma, created_a = a.upload(save_conv_net(tmp_path / "a.onnx", seed=201), name)
        mb, created_b = b.upload(save_conv_net(tmp_path / "b.onnx", seed=202), name)
        assert created_a and created_b and ma["id"] != mb["id"]
        assert (ma["project"], ma["version"]) == (alpha, "1") and (mb["project"], mb["version"]) == (beta, "1")

        # Listings: each project its own; the farm's admin every project, or one with ?project=.
        assert [m["id"] for m in a.models(name=name)["items"]] == [ma["id"]]
        assert [m["id"] for m in b.models(name=name)["items"]] == [mb["id"]]
        assert {m["id"] for m in api.get("/v1/models", params={"name": name}).json()["items"]} == {ma["id"], mb["id"]}
        assert [m["id"] for m in api.get("/v1/models", params={"name": name, "project": beta}).json()["items"]] == [
            mb["id"]
        ]
        assert a.get("/v1/models", project=beta)["total"] == 0  # asking for another project shows nothing

        # Another project's ids are 404, as if they did not exist, for every kind of access.
        hers = ma["id"]
        for method, path, kwargs in [
            ("GET", f"/v1/models/{hers}", {}),
            ("GET", f"/v1/models/{hers}/content", {}),
            ("GET", f"/v1/models/{hers}/report", {}),
            ("POST", "/v1/builds", {"json": {"model_id": hers, "targets": [CPU], "spec": NO_CHECKS}}),
            ("POST", "/v1/sweeps", {"json": {"model_id": hers, "targets": [CPU], "axes": {"precision": ["fp32"]}}}),
            ("POST", f"/v1/models/{hers}/samples", {"files": {"file": ("s.npz", b"PK", "application/octet-stream")}}),
        ]:
            r = httpx.request(
                method, f"{farm.url}{path}", headers=bearer(projects[beta]["build"]), timeout=30, **kwargs
            )
            assert r.status_code == 404 and f"no model with id {hers}" in r.json()["detail"], (path, r.text)

        # A build of alpha's model, and its engine: alpha reads and resolves them, beta cannot.
        build = a.build(ma["id"], [CPU], {**sample_spec(), **NO_CHECKS})
        task = a.wait_build(build["id"], timeout=300)["tasks"][0]
        assert task["state"] == "succeeded", task
        engine_id = task["engine_id"]
        assert a.get(f"/v1/engines/{engine_id}")["id"] == engine_id
        assert [e["id"] for e in a.engines(model=name)["items"]] == [engine_id]
        assert b.engines(model=name)["total"] == 0 and engine_id not in [e["id"] for e in b.engines()["items"]]
        for path in (
            f"/v1/engines/{engine_id}",
            f"/v1/engines/{engine_id}/content",
            f"/v1/engines/{engine_id}/benchmarks",
            f"/v1/builds/{build['id']}",
        ):
            r = httpx.get(f"{farm.url}{path}", headers=bearer(projects[beta]["read"]), timeout=30)
            assert r.status_code == 404 and "no " in r.json()["detail"], (path, r.text)
        assert build["id"] not in [x["id"] for x in b.get("/v1/builds")]
        assert build["id"] in [x["id"] for x in a.get("/v1/builds")]

        got = httpx.post(
            f"{farm.url}/v1/resolve",
            headers=bearer(projects[alpha]["read"]),
            timeout=30,
            json={"model": name, "machine": MACHINE},
        )
        assert got.status_code == 200 and got.json()["engine"]["id"] == engine_id, got.text
        # Beta's model of that name is its own, which has no engine yet.
        denied = httpx.post(
            f"{farm.url}/v1/resolve",
            headers=bearer(projects[beta]["read"]),
            timeout=30,
            json={"model": name, "machine": MACHINE},
        )
        assert denied.status_code == 404 and denied.json()["detail"].startswith(
            f"no engines of {name} are built yet"
        ), denied.text

        # The farm's admin: a name two projects use is ambiguous to resolve without a project.
        both = api.post("/v1/resolve", json={"model": name, "machine": MACHINE})
        assert both.status_code == 409 and "several projects" in both.json()["detail"], both.text


def test_project_tokens_stay_in_their_project(farm, api, projects, tmp_path):
    alpha, beta = projects
    path = save_conv_net(tmp_path / "m.onnx", seed=203)
    # Uploading into another project is refused; naming one's own is fine.
    r = httpx.post(
        f"{farm.url}/v1/models",
        headers=bearer(projects[alpha]["build"]),
        timeout=60,
        data={"name": unique_name("x"), "project": beta},
        files={"file": ("m.onnx", path.read_bytes())},
    )
    assert r.status_code == 403 and f"project {alpha!r}" in r.json()["detail"], r.text
    bad = httpx.post(
        f"{farm.url}/v1/models",
        headers=farm.headers,
        timeout=60,
        data={"name": unique_name("x"), "project": "../etc"},
        files={"file": ("m.onnx", path.read_bytes())},
    )
    assert bad.status_code == 422 and "project" in bad.text, bad.text
    # The farm's admin can upload into a project: the project's tokens see it.
    name = unique_name("placed")
    placed = httpx.post(
        f"{farm.url}/v1/models",
        headers=farm.headers,
        timeout=60,
        data={"name": name, "project": alpha},
        files={"file": ("m.onnx", path.read_bytes())},
    )
    assert placed.status_code == 201 and placed.json()["project"] == alpha, placed.text
    assert Client(farm.url, token=projects[alpha]["read"]).models(name=name)["total"] == 1

    # A project's admin makes tokens of its project only and sees only those.
    admin = api.post("/v1/tokens", json={"name": "alpha-admin", "scopes": ["admin"], "project": alpha}).json()["token"]
    other = httpx.post(
        f"{farm.url}/v1/tokens", headers=bearer(admin), json={"name": "x", "scopes": ["read"], "project": beta}
    )
    assert other.status_code == 403 and f"project {alpha!r}" in other.json()["detail"]
    mine = httpx.post(f"{farm.url}/v1/tokens", headers=bearer(admin), json={"name": "alpha-ci", "scopes": ["read"]})
    assert mine.status_code == 201 and mine.json()["project"] == alpha
    listed = httpx.get(f"{farm.url}/v1/tokens", headers=bearer(admin)).json()
    assert listed and {t["project"] for t in listed} == {alpha}
    beta_token_ids = [t["id"] for t in api.get("/v1/tokens").json() if t["project"] == beta]
    assert httpx.delete(f"{farm.url}/v1/tokens/{beta_token_ids[0]}", headers=bearer(admin)).status_code == 404

    # The CLI makes project tokens too, and lists their project.
    env = {**farm.env, "ENGINEFARM_TOKEN": ""}
    token = cli("token", "create", "--scope", "read", "--name", "cli-proj", "--project", alpha, env=env).stdout.strip()
    assert Client(farm.url, token=token).get("/v1/models", project=beta)["total"] == 0
    assert alpha in cli("token", "list", env=env).stdout
    for project, says in (("a b", "U+0020 SPACE"), ("te\u0430m", "U+0430 CYRILLIC SMALL LETTER A")):
        refused = " ".join(
            cli(
                "token", "create", "--scope", "read", "--name", "x", "--project", project, env=env, expect=1
            ).stderr.split()
        )
        assert "project must be 1-64 ASCII letters, digits" in refused and says in refused, refused


def test_an_engine_shared_through_identical_bytes_shows_only_the_readers_own_model(farm, projects, tmp_path):
    """Was a leak: project alpha uploaded the same bytes as beta's secret model and read the shared engine by id;
    the answer, and the download's file name, carried beta's model name (and its model id)."""
    alpha, beta = projects
    path = save_conv_net(tmp_path / "secret.onnx", seed=20399)
    secret, ours = unique_name("beta-secret-project-x"), unique_name("alpha-public")
    with Client(farm.url, token=projects[beta]["build"]) as b, Client(farm.url, token=projects[alpha]["build"]) as a:
        mb, _ = b.upload(path, secret)
        built = b.wait_build(b.build(mb["id"], [CPU], {**sample_spec(), **NO_CHECKS})["id"], timeout=300)
        engine_id = built["tasks"][0]["engine_id"]
        assert built["tasks"][0]["state"] == "succeeded", built
        ma, _ = a.upload(path, ours)
        seen = a.get(f"/v1/engines/{engine_id}")
        assert (seen["model_name"], seen["model_id"], seen["model_version"]) == (ours, ma["id"], ma["version"])
        download = httpx.get(
            f"{farm.url}/v1/engines/{engine_id}/content", headers=bearer(projects[alpha]["read"]), follow_redirects=True
        )
        assert download.status_code == 200
        assert secret not in download.headers["content-disposition"] and ours in download.headers["content-disposition"]
        listed = a.get("/v1/engines", model=ours)["items"]
        assert [(e["id"], e["model_name"], e["model_id"]) for e in listed] == [(engine_id, ours, ma["id"])]
        # The owner still sees its own name.
        assert b.get(f"/v1/engines/{engine_id}")["model_name"] == secret
