"""The dashboard's session and CSRF rules over plain HTTP (httpx) against the session farm: cookie flags (Secure
behind a trusted TLS-terminating proxy), the sign-in form's own CSRF value, refusals without the page's token, and
where a sign-in may send the browser."""

from __future__ import annotations

import re

import httpx
import pytest

from server.embedded import Farm

FIELD = re.compile(r'name="csrf" value="([^"]+)"')


def signin_form(client: httpx.Client, next_path: str = "/ui/models") -> str:
    page = client.get("/ui/signin", params={"next": next_path})
    assert page.status_code == 200
    return FIELD.search(page.text).group(1)


@pytest.fixture
def browserless(farm):
    with httpx.Client(base_url=farm.url, timeout=30, follow_redirects=False) as client:
        yield client


def signed_in(client: httpx.Client, token: str) -> str:
    """Sign in; returns the pages' CSRF token."""
    answer = client.post("/ui/signin", data={"token": token, "csrf": signin_form(client), "next": "/ui/models"})
    assert answer.status_code == 303, answer.text
    return FIELD.search(client.get("/ui/models").text).group(1)


def test_the_session_cookie_is_httponly_strict_and_not_the_token(farm, browserless):
    answer = browserless.post(
        "/ui/signin", data={"token": farm.token, "csrf": signin_form(browserless), "next": "/ui/models"}
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/models"
    cookie = next(c for c in answer.headers.get_list("set-cookie") if c.startswith("ef_session="))
    value = cookie.split(";", 1)[0].split("=", 1)[1]
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/ui"} <= flags, flags
    assert value and value != farm.token and farm.token not in cookie  # a session credential of its own
    page = browserless.get("/ui/models")
    assert page.status_code == 200
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["cache-control"] == "no-store"
    # The session is an API token with the signer's rights, listed (and revocable) under its name.
    tokens = httpx.get(f"{farm.url}/v1/tokens", headers=farm.headers, timeout=30).json()
    assert any(
        t["name"] == "browser session of test-session" and t["state"] == "active" and t["scopes"] == ["admin"]
        for t in tokens
    )


def test_sign_in_needs_the_forms_csrf_value_and_a_valid_token(farm, browserless):
    signin_form(browserless)
    refused = browserless.post("/ui/signin", data={"token": farm.token, "next": "/ui/models"})
    assert refused.status_code == 403 and "ef_session" not in refused.headers.get("set-cookie", "")
    wrong = browserless.post("/ui/signin", data={"token": "ef_not-a-token", "csrf": signin_form(browserless)})
    assert wrong.status_code == 401 and "not valid" in wrong.text
    assert "ef_session" not in wrong.headers.get("set-cookie", "")


def test_sign_in_sends_the_browser_only_to_dashboard_pages(farm, browserless):
    for elsewhere in ("https://evil.example/", "//evil.example/ui/x", "/v1/tokens"):
        answer = browserless.post(
            "/ui/signin", data={"token": farm.token, "csrf": signin_form(browserless, elsewhere), "next": elsewhere}
        )
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/models", elsewhere


def test_posts_without_the_pages_csrf_token_are_refused(farm, browserless, conv_model):
    csrf = signed_in(browserless, farm.token)
    model = httpx.post(
        f"{farm.url}/v1/models",
        headers=farm.headers,
        timeout=60,
        data={"name": "ui-csrf"},
        files={"file": ("m.onnx", conv_model.read_bytes())},
    ).json()
    form = {"targets": "onnxruntime/cpu-x86_64", "precision": "fp32"}
    for headers, data in [({}, form), ({}, {**form, "csrf": "f" * 64}), ({"X-CSRF-Token": "f" * 64}, form)]:
        refused = browserless.post(f"/ui/models/{model['id']}/builds", data=data, headers=headers)
        assert refused.status_code == 403 and "CSRF" in refused.text
    upload = browserless.post(
        "/ui/models/upload",
        data={"name": "ui-csrf-2"},
        headers={"Accept": "application/json"},
        files={"file": ("m.onnx", conv_model.read_bytes())},
    )
    assert upload.status_code == 403 and upload.json()["error"] == "CsrfRefused"
    token = browserless.post("/ui/tokens", data={"name": "x", "scope": "admin"})
    assert token.status_code == 403
    assert browserless.post("/ui/signout").status_code == 403  # signing out someone else is a change too
    # With the token the same form is taken: a malformed spec is a 422 that names the field, not a 403.
    taken = browserless.post(
        f"/ui/models/{model['id']}/builds",
        data={**form, "csrf": csrf, "dynamic": "input", "min:input": "1x3", "opt:input": "a", "max:input": "8x3x32x32"},
    )
    assert taken.status_code == 422 and "opt:input" in taken.text
    assert browserless.post("/ui/signout", data={"csrf": csrf}).status_code == 303


def test_pages_and_fragments_without_a_session(farm, browserless):
    page = browserless.get("/ui/models/1")
    assert page.status_code == 303 and page.headers["location"] == "/ui/signin?next=/ui/models/1"
    fragment = browserless.get("/ui/models/1/matrix", headers={"HX-Request": "true"})
    assert fragment.status_code == 401 and fragment.headers["hx-redirect"].startswith("/ui/signin")
    assert browserless.get("/ui/static/vendor/htmx-2.0.11/htmx.min.js").status_code == 200  # assets are public


def test_the_build_form_takes_trtexec_flags_and_submits_what_the_api_would(farm, browserless, api, conv_model):
    csrf = signed_in(browserless, farm.token)
    model = api.post("/v1/models", data={"name": "ui-trtexec"}, files={"file": ("m.onnx", conv_model.read_bytes())})
    model_id = model.json()["id"]
    form = {
        "csrf": csrf,
        "targets": "onnxruntime/cpu-x86_64",
        "precision": "fp32",
        "dynamic": "input",
        "min:input": "1x3x32x32",
        "opt:input": "1x3x32x32",
        "max:input": "2x3x32x32",
        "trtexec": "--fp16 --minShapes=input:1x3x32x32 --optShapes=input:2x3x32x32 --maxShapes=input:4x3x32x32",
    }
    answer = browserless.post(f"/ui/models/{model_id}/builds", data=form, headers={"HX-Request": "true"})
    assert answer.status_code == 200, answer.text
    build_id = int(re.search(r'href="/ui/builds/(\d+)"', answer.text).group(1))
    # the matrix it answers follows the build
    assert 'data-live="true"' in answer.text and f"/ui/models/{model_id}/matrix?wait=" in answer.text
    spec = api.get(f"/v1/builds/{build_id}").json()["spec"]
    assert spec["precision"] == "fp16"  # the flags win over the fields
    assert spec["profiles"] == [{"input": {"min": [1, 3, 32, 32], "opt": [2, 3, 32, 32], "max": [4, 3, 32, 32]}}]
    assert spec["benchmark"]["enabled"] is False  # the form's checks box was left unticked
    # An input the model does not have is refused with the API's own 422, naming it.
    form["trtexec"] = "--shapes=nope:1x3x32x32"
    refused = browserless.post(f"/ui/models/{model_id}/builds", data=form, headers={"HX-Request": "true"})
    assert refused.status_code == 422 and "nope" in refused.text
    assert refused.headers["hx-retarget"] == "#messages"  # shown above the page, the matrix left as it was


def test_revoking_the_token_that_signed_in_ends_its_sessions(farm, browserless):
    """A leaked token, revoked: the dashboard sessions it opened end with it, not 12 hours later."""
    made = httpx.post(
        f"{farm.url}/v1/tokens",
        headers=farm.headers,
        timeout=30,
        json={"name": "signs-in-then-revoked", "scopes": ["read"]},
    )
    assert made.status_code == 201, made.text
    signed_in(browserless, made.json()["token"])
    assert browserless.get("/ui/models").status_code == 200
    revoked = httpx.delete(f"{farm.url}/v1/tokens/{made.json()['id']}", headers=farm.headers, timeout=30)
    assert revoked.status_code == 200, revoked.text
    after = browserless.get("/ui/models")
    assert after.status_code == 303 and after.headers["location"].startswith("/ui/signin"), after.text
    tokens = httpx.get(f"{farm.url}/v1/tokens", headers=farm.headers, timeout=30).json()
    assert [t["state"] for t in tokens if t["name"] == "browser session of signs-in-then-revoked"] == ["revoked"]


def _session_cookie_flags(url: str, token: str, address: str, headers: dict[str, str]) -> set[str]:
    """Sign in from ``address`` with ``headers`` on every request; the flags of the session cookie set."""
    with httpx.Client(
        base_url=url,
        timeout=30,
        follow_redirects=False,
        headers=headers,
        transport=httpx.HTTPTransport(local_address=address),
    ) as client:
        form = client.get("/ui/signin")
        # Sent by hand: a client keeps a Secure cookie from being sent over plain http, as a browser would.
        signin_cookie = form.headers["set-cookie"].split(";", 1)[0]
        answer = client.post(
            "/ui/signin",
            headers={"Cookie": signin_cookie},
            data={"token": token, "csrf": FIELD.search(form.text).group(1), "next": "/ui/models"},
        )
        assert answer.status_code == 303, answer.text
        cookie = next(c for c in answer.headers.get_list("set-cookie") if c.startswith("ef_session="))
        return {part.strip().lower() for part in cookie.split(";")[1:]}


@pytest.fixture(scope="module")
def behind_proxy(dist_env, tmp_path_factory):
    """Another API process on the session farm's catalog whose one trusted proxy is 127.0.0.2."""
    f = Farm(
        {**dist_env, "ENGINEFARM_RECONCILE_SECONDS": "0", "ENGINEFARM_FORWARDED_ALLOW_IPS": "127.0.0.2"},
        log_dir=tmp_path_factory.mktemp("proxied-api"),
    )
    try:
        f.start_api()
        yield f
    finally:
        f.stop()


def test_the_session_cookie_is_secure_behind_a_trusted_tls_proxy_only(farm, behind_proxy):
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
    assert "secure" in _session_cookie_flags(behind_proxy.url, farm.token, "127.0.0.2", https)
    # Anyone else saying https is not believed: the connection it came over is plain http.
    assert "secure" not in _session_cookie_flags(behind_proxy.url, farm.token, "127.0.0.1", https)
    assert "secure" not in _session_cookie_flags(behind_proxy.url, farm.token, "127.0.0.2", {})


def test_the_session_cookie_is_secure_where_the_farm_is_served_over_https(farm, dist_env, tmp_path):
    f = Farm(
        {**dist_env, "ENGINEFARM_RECONCILE_SECONDS": "0", "ENGINEFARM_API_URL": "https://farm.example.com"},
        log_dir=tmp_path,
    )
    try:
        f.start_api()
        assert "secure" in _session_cookie_flags(f.url, farm.token, "127.0.0.1", {})
    finally:
        f.stop()
