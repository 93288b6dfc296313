"""Admission control for builds and sweeps, against real farms: a build for a target no live worker serves is
refused unless the request (or the farm) says to queue it; each token, and the farm, may have only so many build
tasks queued or waiting; a refusal writes nothing; two submissions at the limit at once never both get in.
A token's dashboard sessions share its allowances (queued tasks, uploads in flight), and sign-in is rate-limited."""

from __future__ import annotations

import re
import threading
import uuid
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import delete, func, select, update

from enginefarm.client import ApiError, Client
from enginefarm.core.config import Settings
from enginefarm.graph.samples import conv_net, sample_spec
from server import localservers
from server.embedded import Farm, embedded_env, issue_token
from storage.db import session_scope
from storage.tables import ApiTokenRow, BuildRow, BuildTaskRow, SweepRow, utcnow
from storage.tokens import hash_token
from tests.conftest import PG_DB
from tests.e2e.api.test_body_limits import Drip, spool_files, wait_for
from tests.helpers import WORKER_A, WORKER_B, unique_name

CPU = "onnxruntime/cpu-x86_64"
NO_CHECKS = {"benchmark": {"enabled": False}, "accuracy": {"enabled": False}}
SPEC = {**sample_spec(), **NO_CHECKS}
UNSERVED = "tensorrt/sm90"  # neither of the session farm's workers builds it
# The private farm has no worker building these: its tasks stay queued.
GPU = ["tensorrt-rtx/sm80", "tensorrt-rtx/sm86", "tensorrt-rtx/sm89", "tensorrt-rtx/sm120"]
PER_TOKEN, PER_FARM = 3, 5
UPLOADS_PER_TOKEN, SIGNINS_PER_TOKEN, SIGNINS_PER_ADDRESS = 2, 4, 6
CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')


def _counts(settings: Settings) -> tuple[int, int, int]:
    """(builds, build tasks, sweeps) in a catalog."""
    with session_scope(settings) as s:
        return tuple(s.scalar(select(func.count()).select_from(t)) for t in (BuildRow, BuildTaskRow, SweepRow))


# --------------------------------------------------------------------------- targets no live worker serves


@pytest.fixture(scope="module")
def model_id(farm) -> int:
    with httpx.Client(base_url=farm.url, headers=farm.headers, timeout=60) as c:
        r = c.post(
            "/v1/models",
            data={"name": unique_name("admission")},
            files={"file": ("m.onnx", conv_net(seed=3131).SerializeToString())},
        )
        assert r.status_code == 201, r.text
        return r.json()["id"]


def test_a_build_for_a_target_no_live_worker_serves_is_refused_and_nothing_is_written(api, dist_settings, model_id):
    before = _counts(dist_settings)
    r = api.post("/v1/builds", json={"model_id": model_id, "targets": ["tensorrt-rtx/sm86", UNSERVED], "spec": SPEC})
    assert r.status_code == 409, r.text
    body = r.json()
    assert f"no live worker serves {UNSERVED}" in body["detail"]
    assert '"queue_without_worker": true' in body["detail"] and "--queue-without-worker" in body["detail"]
    assert body["unserved"] == [UNSERVED]
    assert set(WORKER_A + WORKER_B) <= set(body["served"])
    assert "tensorrt-rtx/sm86" in body["detail"]  # what the live workers do build
    assert _counts(dist_settings) == before


def test_a_sweep_for_a_target_no_live_worker_serves_is_refused_whole(api, dist_settings, model_id):
    before = _counts(dist_settings)
    r = api.post(
        "/v1/sweeps",
        json={"model_id": model_id, "targets": [UNSERVED], "spec": SPEC, "axes": {"optimization_level": [1, 3]}},
    )
    assert r.status_code == 409, r.text
    assert f"no live worker serves {UNSERVED}" in r.json()["detail"]
    assert _counts(dist_settings) == before


def test_asked_to_queue_without_a_worker_the_build_is_taken_and_says_it_waits(farm, dist_settings, model_id):
    with Client(farm.url) as c:
        build = c.build(model_id, [UNSERVED], SPEC, queue_without_worker=True)
    (task,) = build["tasks"]
    assert task["state"] == "queued"
    assert task["status_detail"] == f"waiting: no live worker serves {UNSERVED}"
    with session_scope(dist_settings) as s:  # the build records who asked for it
        token_id = s.scalar(select(ApiTokenRow.id).where(ApiTokenRow.token_hash == hash_token(farm.token)))
        assert s.get(BuildRow, build["id"]).token_id == token_id


# --------------------------------------------------------------------------- queue limits, on a farm of their own


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def small_farm(request, base_services, tmp_path_factory):
    """A farm with low queue limits and no worker (what it queues stays queued), on PostgreSQL or SQLite, with
    its own blob directory and database broker. It queues for absent workers by default."""
    data = tmp_path_factory.mktemp(f"small-farm-{request.param}")
    env = embedded_env(data) | {
        "ENGINEFARM_MAX_QUEUED_TASKS_PER_TOKEN": str(PER_TOKEN),
        "ENGINEFARM_MAX_QUEUED_TASKS": str(PER_FARM),
        "ENGINEFARM_QUEUE_WITHOUT_WORKER": "true",
        "ENGINEFARM_RECONCILE_SECONDS": "0",
        "ENGINEFARM_HEARTBEAT_SECONDS": "1",
        "ENGINEFARM_WORKER_TTL_SECONDS": "10",
        "ENGINEFARM_MAX_UPLOADS_PER_TOKEN": str(UPLOADS_PER_TOKEN),
        "ENGINEFARM_SIGNIN_PER_MINUTE_PER_TOKEN": str(SIGNINS_PER_TOKEN),
        "ENGINEFARM_SIGNIN_PER_MINUTE_PER_ADDRESS": str(SIGNINS_PER_ADDRESS),
    }
    with localservers.scratch_postgres(f"{PG_DB}_admission") if request.param == "postgresql" else _nothing() as url:
        if url:
            env["ENGINEFARM_DATABASE_URL"] = url
        settings = Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items()})
        f = Farm(env, log_dir=data, token=issue_token(settings, "small-admin", ["admin"]))
        try:
            f.start_api()
            with httpx.Client(base_url=f.url, headers=f.headers, timeout=60) as c:
                r = c.post(
                    "/v1/models",
                    data={"name": "small"},
                    files={"file": ("m.onnx", conv_net(seed=3132).SerializeToString())},
                )
                assert r.status_code == 201, r.text
            f.settings, f.model_id = settings, r.json()["id"]
            yield f
        finally:
            f.stop()


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


@pytest.fixture(autouse=True)
def _empty_queue(request):
    """Each limit test starts with nothing queued: what an earlier one left queued is failed."""
    yield
    if "small_farm" in request.fixturenames:
        farm = request.getfixturevalue("small_farm")
        with session_scope(farm.settings) as s:
            s.execute(
                update(BuildTaskRow)
                .where(BuildTaskRow.state.in_(["queued", "waiting"]))
                .values(state="failed", error="cleared between tests")
            )


def _token(farm: Farm) -> str:
    return issue_token(farm.settings, f"builder-{uuid.uuid4().hex[:6]}", ["build"])


def _build(farm: Farm, token: str, targets: list[str], spec: dict | None = None, **body) -> httpx.Response:
    return httpx.post(
        f"{farm.url}/v1/builds",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
        json={"model_id": farm.model_id, "targets": targets, "spec": spec or SPEC, **body},
    )


def _refused_for_limit(r: httpx.Response, limit: int, queued: int, setting: str) -> None:
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) > 0
    detail = r.json()["detail"]
    assert (
        f"at most {limit}" in detail
        and f"has {queued} build tasks queued or waiting now" in detail
        and setting in detail
    ), detail
    assert r.json()["limit"] == limit and r.json()["queued"] == queued


def test_a_token_may_queue_only_so_many_tasks(small_farm):
    token = _token(small_farm)
    assert _build(small_farm, token, GPU[:2]).status_code == 202
    before = _counts(small_farm.settings)
    _refused_for_limit(_build(small_farm, token, GPU[2:]), PER_TOKEN, 2, "ENGINEFARM_MAX_QUEUED_TASKS_PER_TOKEN")
    assert _counts(small_farm.settings) == before  # refused whole: no build, no task
    assert _build(small_farm, token, GPU[2:3]).status_code == 202  # up to the limit is fine
    _refused_for_limit(_build(small_farm, token, GPU[3:]), PER_TOKEN, 3, "ENGINEFARM_MAX_QUEUED_TASKS_PER_TOKEN")
    # Another token has its own allowance.
    assert _build(small_farm, _token(small_farm), GPU[:1]).status_code == 202


def test_a_sweep_is_counted_whole(small_farm):
    token = _token(small_farm)
    before = _counts(small_farm.settings)
    r = httpx.post(
        f"{small_farm.url}/v1/sweeps",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
        json={
            "model_id": small_farm.model_id,
            "targets": GPU[:2],
            "spec": SPEC,
            "axes": {"optimization_level": [1, 3]},
        },
    )
    _refused_for_limit(r, PER_TOKEN, 0, "ENGINEFARM_MAX_QUEUED_TASKS_PER_TOKEN")
    assert _counts(small_farm.settings) == before


def test_the_farm_may_queue_only_so_many_tasks(small_farm):
    assert _build(small_farm, _token(small_farm), GPU[:3]).status_code == 202
    assert _build(small_farm, _token(small_farm), GPU[:2]).status_code == 202
    before = _counts(small_farm.settings)
    _refused_for_limit(_build(small_farm, _token(small_farm), GPU[:1]), PER_FARM, 5, "ENGINEFARM_MAX_QUEUED_TASKS")
    assert _counts(small_farm.settings) == before


def test_submissions_at_the_limit_at_once_never_all_get_in(small_farm):
    """Six single-task builds of one token at the same moment, against a limit of three: exactly three get in."""
    for _ in range(3):
        token = _token(small_farm)
        barrier = threading.Barrier(6)
        answers: list[int] = []

        def submit(target: str) -> None:  # its threads are joined within this iteration
            barrier.wait()  # noqa: B023
            answers.append(_build(small_farm, token, [target]).status_code)  # noqa: B023

        threads = [threading.Thread(target=submit, args=(t,)) for t in GPU + GPU[:2]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(answers) == [202] * PER_TOKEN + [429] * (6 - PER_TOKEN), answers
        with session_scope(small_farm.settings) as s:
            s.execute(update(BuildTaskRow).where(BuildTaskRow.state == "queued").values(state="failed"))


def test_queue_without_worker_false_overrides_the_farm_default(small_farm):
    before = _counts(small_farm.settings)
    r = _build(small_farm, _token(small_farm), GPU[:1], queue_without_worker=False)
    assert r.status_code == 409 and "no live worker serves tensorrt-rtx/sm80" in r.json()["detail"], r.text
    assert r.json()["served"] == []
    assert _counts(small_farm.settings) == before


def test_tasks_answered_from_the_catalog_do_not_count(small_farm):
    """At the limit, a build whose engine exists is still answered (its task is born succeeded); a new one is not."""
    small_farm.start_worker("cpu", [CPU], bench_targets=[])
    try:
        small_farm.wait_workers(["cpu"])
        token = _token(small_farm)
        with Client(small_farm.url, token=token) as c:
            done = c.wait_build(c.build(small_farm.model_id, [CPU], SPEC)["id"], timeout=120, poll=0.2)
            assert done["tasks"][0]["state"] == "succeeded", done
            assert _build(small_farm, token, GPU[:3]).status_code == 202  # the token is at its limit now
            again = c.build(small_farm.model_id, [CPU], SPEC)
            assert again["tasks"][0]["reused"] and again["tasks"][0]["state"] == "succeeded"
            with pytest.raises(ApiError) as refused:
                c.build(small_farm.model_id, [CPU], {**SPEC, "optimization_level": 1})
            assert refused.value.status_code == 429
    finally:
        small_farm.stop_process(small_farm.workers.pop("cpu"))


# --------------------------------------------------------------------------- dashboard sessions and sign-in


def _browser(farm: Farm, address: str = "127.0.0.1") -> httpx.Client:
    """A client without a token, connecting from ``address`` (any of 127.0.0.0/8 reaches the farm)."""
    return httpx.Client(
        base_url=farm.url, timeout=60, follow_redirects=False, transport=httpx.HTTPTransport(local_address=address)
    )


def _sign_in(client: httpx.Client, token: str) -> httpx.Response:
    form = client.get("/ui/signin")
    assert form.status_code == 200, form.text
    return client.post(
        "/ui/signin", data={"token": token, "csrf": CSRF_FIELD.search(form.text).group(1), "next": "/ui/models"}
    )


def _session(farm: Farm, token: str, address: str = "127.0.0.1") -> str:
    """A dashboard session opened with ``token``: the cookie's credential, which also works as a bearer token."""
    with _browser(farm, address) as browser:
        answer = _sign_in(browser, token)
        assert answer.status_code == 303, answer.text
        return browser.cookies["ef_session"]


def _sessions_of(farm: Farm, token: str) -> list[ApiTokenRow]:
    with session_scope(farm.settings) as s:
        root = s.scalar(select(ApiTokenRow).where(ApiTokenRow.token_hash == hash_token(token)))
        rows = list(s.scalars(select(ApiTokenRow).where(ApiTokenRow.parent_id == root.id)))
        s.expunge_all()
        return rows


def test_sessions_a_token_opens_share_its_queue_allowance(small_farm):
    """At its limit, a token's sessions cannot queue more: before, each sign-in brought a fresh allowance."""
    token = _token(small_farm)
    assert _build(small_farm, token, GPU[:2]).status_code == 202
    sessions = [_session(small_farm, token, "127.0.0.11") for _ in range(3)]
    before = _counts(small_farm.settings)
    _refused_for_limit(_build(small_farm, sessions[0], GPU[2:]), PER_TOKEN, 2, "ENGINEFARM_MAX_QUEUED_TASKS_PER_TOKEN")
    assert _counts(small_farm.settings) == before
    assert _build(small_farm, sessions[1], GPU[2:3]).status_code == 202  # the token's last place, taken by a session
    for credential in [token, *sessions]:
        _refused_for_limit(
            _build(small_farm, credential, GPU[3:]), PER_TOKEN, 3, "ENGINEFARM_MAX_QUEUED_TASKS_PER_TOKEN"
        )
    # Sessions removed once ended give nothing back: their builds count as the token's.
    with session_scope(small_farm.settings) as s:
        s.execute(delete(ApiTokenRow).where(ApiTokenRow.token_hash.in_([hash_token(c) for c in sessions])))
    _refused_for_limit(_build(small_farm, token, GPU[3:]), PER_TOKEN, 3, "ENGINEFARM_MAX_QUEUED_TASKS_PER_TOKEN")


def test_sessions_a_token_opens_share_its_uploads_in_flight(small_farm):
    token = _token(small_farm)
    sessions = [_session(small_farm, token, "127.0.0.12") for _ in range(2)]
    before = spool_files(small_farm.settings)
    drips = [Drip(small_farm.url, token)] + [Drip(small_farm.url, s) for s in sessions[: UPLOADS_PER_TOKEN - 1]]
    try:
        wait_for(lambda: len(spool_files(small_farm.settings) - before) >= UPLOADS_PER_TOKEN, 20, "uploads spooling")
        r = httpx.post(
            f"{small_farm.url}/v1/models",
            headers={"Authorization": f"Bearer {sessions[-1]}"},
            timeout=60,
            data={"name": unique_name("third")},
            files={"file": ("m.onnx", conv_net(seed=3133).SerializeToString())},
        )
        assert r.status_code == 429, r.text
        assert f"{UPLOADS_PER_TOKEN} uploads in flight" in r.json()["detail"], r.text
        assert "ENGINEFARM_MAX_UPLOADS_PER_TOKEN" in r.json()["detail"]
    finally:
        for drip in drips:
            drip.close()


def test_a_token_opens_only_so_many_sessions_a_minute(small_farm):
    token = _token(small_farm)
    with _browser(small_farm, "127.0.0.2") as browser:
        for _ in range(SIGNINS_PER_TOKEN):
            assert _sign_in(browser, token).status_code == 303
        refused = _sign_in(browser, token)
        assert refused.status_code == 429, refused.text
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert "ENGINEFARM_SIGNIN_PER_MINUTE_PER_TOKEN" in refused.text
        assert "ef_session" not in refused.headers.get("set-cookie", "")
        assert len(_sessions_of(small_farm, token)) == SIGNINS_PER_TOKEN
        assert _sign_in(browser, _token(small_farm)).status_code == 303  # another token is not held back


def test_an_address_tries_only_so_many_sign_ins_a_minute(small_farm):
    with _browser(small_farm, "127.0.0.3") as browser:
        for _ in range(SIGNINS_PER_ADDRESS):
            assert _sign_in(browser, "ef_not-a-token").status_code == 401
        refused = _sign_in(browser, _token(small_farm))  # a valid token too, once the address is past its rate
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1, refused.text
    assert "ENGINEFARM_SIGNIN_PER_MINUTE_PER_ADDRESS" in refused.text
    with _browser(small_farm, "127.0.0.4") as elsewhere:
        assert _sign_in(elsewhere, _token(small_farm)).status_code == 303


def test_ended_sessions_are_removed_at_sign_in(small_farm):
    """Sessions signed out, revoked or expired are deleted once they no longer count for the sign-in rate."""
    token = _token(small_farm)
    kept, signed_out, expired = (_session(small_farm, token, "127.0.0.13") for _ in range(3))
    with _browser(small_farm, "127.0.0.13") as browser:
        browser.cookies.set("ef_session", signed_out, path="/ui")
        csrf = CSRF_FIELD.search(browser.get("/ui/models").text).group(1)
        assert browser.post("/ui/signout", data={"csrf": csrf}).status_code == 303
    earlier = utcnow() - timedelta(minutes=2)
    with session_scope(small_farm.settings) as s:
        for credential in (kept, signed_out, expired):
            s.execute(
                update(ApiTokenRow)
                .where(ApiTokenRow.token_hash == hash_token(credential))
                .values(
                    created_at=earlier,
                    expires_at=earlier + timedelta(seconds=90)
                    if credential == expired
                    else utcnow() + timedelta(hours=1),
                )
            )
    assert len(_sessions_of(small_farm, token)) == 3
    newest = _session(small_farm, token, "127.0.0.13")
    assert {r.token_hash for r in _sessions_of(small_farm, token)} == {hash_token(kept), hash_token(newest)}
    assert (
        httpx.get(f"{small_farm.url}/v1/workers", headers={"Authorization": f"Bearer {kept}"}, timeout=30).status_code
        == 200
    )
