"""The dashboard in a real browser (Debian's Chromium, driven by Playwright) against the session farm: the API under
uvicorn, Celery workers, PostgreSQL, Redis and SeaweedFS.

With ENGINEFARM_UI_SCREENSHOTS=DIR set, each page is also saved as DIR/<page>.png at 1280 px wide, and the model
page at phone width (390 px): ``ENGINEFARM_UI_SCREENSHOTS=docs/dashboard pytest tests/ui`` remakes the README's.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from enginefarm.client import Client
from enginefarm.core.probe.modules import probe_modules
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.browser import launch_chromium
from tests.helpers import unique_name

CPU = "onnxruntime/cpu-x86_64"
SM86 = "tensorrt-rtx/sm86"
SHOTS = os.environ.get("ENGINEFARM_UI_SCREENSHOTS")
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
P50_COLOUR = (0x0B, 0x5C, 0xAD)  # report.js's p50 bars
PREVIOUS_COLOUR = (0x8C, 0x95, 0x9F)  # and version N-1's


def painted(page, rgb: tuple[int, int, int]) -> int:
    """How many pixels inside the chart's plot area (not its legend) have this colour."""
    return page.evaluate(
        """([r, g, b]) => { const c = document.getElementById('latency-chart');
        const a = Chart.getChart(c).chartArea, k = window.devicePixelRatio;
        const d = c.getContext('2d').getImageData(a.left * k, a.top * k, (a.right - a.left) * k,
                                                  (a.bottom - a.top) * k).data; let n = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i] === r && d[i + 1] === g && d[i + 2] === b) n++;
        return n; }""",
        list(rgb),
    )


def shot(page, name: str, full_page: bool = True) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=full_page)


@pytest.fixture(scope="module")
def browser():
    with launch_chromium() as chromium:
        yield chromium


def sign_in(page, farm, token: str, next_path: str = "/ui/models") -> None:
    """Sign in with the keyboard only: Tab to the token field, type, Enter."""
    page.goto(f"{farm.url}{next_path}")
    assert "/ui/signin" in page.url  # not signed in: sent to the form, with where to come back
    for _ in range(8):
        if page.evaluate("document.activeElement && document.activeElement.id") == "token":
            break
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "token", "the token field is not reachable by keyboard"
    page.keyboard.type(token)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{farm.url}{next_path}")  # exactly: the sign-in form's own URL ends with ?next=PATH


@pytest.fixture(scope="module")
def built(farm, browser, tmp_path_factory):
    """Sign in, upload a model by the browser, build it for sm86 and the CPU, and watch the matrix turn green
    without reloading. Returns what later tests look at: the page (still signed in) and the model's id and name."""
    context = browser.new_context(viewport=DESKTOP, accept_downloads=True)
    page = context.new_page()
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)
    errors: list[str] = []  # script errors and CSP refusals: an asset or inline code the policy blocks shows here
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))

    page.goto(f"{farm.url}/ui/signin")
    shot(page, "signin")
    sign_in(page, farm, farm.token)
    name = unique_name("ui")
    model = save_conv_net(tmp_path_factory.mktemp("ui") / f"{name}.onnx", seed=uuid.uuid4().int % 10_000)
    # Dropped on the drop zone, as a user drags it from a file manager.
    dropped = page.evaluate_handle(
        """([bytes, name]) => { const dt = new DataTransfer();
        dt.items.add(new File([new Uint8Array(bytes)], name)); return dt; }""",
        [list(model.read_bytes()), model.name],
    )
    page.dispatch_event("#dropzone", "drop", {"dataTransfer": dropped})
    assert page.evaluate("document.getElementById('upload-file').files[0].name") == model.name
    assert page.input_value("#upload-name") == name  # the name is taken from the file
    page.click("#upload-form button[type=submit]")
    page.wait_for_url(re.compile(r"/ui/models/\d+$"))
    model_id = int(page.url.rsplit("/", 1)[1])
    assert page.locator("h1").inner_text().startswith(name)
    # Inputs with their dims; the build form offers a profile for the dynamic batch, pre-filled.
    assert "batch×3×32×32" in page.locator("table").first.inner_text()
    assert page.input_value("input[name='min:input']") == "1x3x32x32"
    assert page.input_value("input[name='max:input']") == "8x3x32x32"
    # The targets offered are those live workers serve.
    offered = page.locator("input[name=targets]").evaluate_all("els => els.map(e => e.value)")
    assert {CPU, SM86, "tensorrt-rtx/sm80", "tensorrt-rtx/sm89"} <= set(offered)

    # A form with a problem is answered in place, above the page; nothing is built.
    page.click("#build-form button[type=submit]")
    page.wait_for_selector("#messages .problem")
    assert "choose at least one target" in page.inner_text("#messages")
    assert page.locator("#matrix").inner_text().startswith("Not built yet")
    assert len(errors) == 2 and "422" in errors[0]  # the browser and htmx log the refusal: expected here
    errors.clear()
    page.check(f"input[name=targets][value='{CPU}']")
    page.check(f"input[name=targets][value='{SM86}']")
    page.evaluate("window.__sameDocument = true")
    before = len(navigations)
    page.click("#build-form button[type=submit]")
    cpu_cell = page.locator(f"td.cell[data-target='{CPU}']")
    cpu_cell.wait_for()
    first_state = cpu_cell.get_attribute("data-state")
    # New bytes start queued; a quiet machine's worker may have built the CPU artifact before the cell is drawn.
    assert first_state in ("queued", "running", "succeeded"), first_state
    build_link = page.locator(".notice a").get_attribute("href")
    # The cells turn to succeeded by polling, in this same document.
    page.wait_for_selector(f"td.cell[data-target='{CPU}'][data-state='succeeded']", timeout=240_000)
    page.wait_for_selector(f"td.cell[data-target='{SM86}'][data-state='succeeded']", timeout=240_000)
    # The CPU engine's benchmark and accuracy check land in the cell too (the matrix polls until it has them).
    page.wait_for_function(
        f"""() => {{ const c = document.querySelector("td.cell[data-target='{CPU}']");
                    return c && /p50 \\d/.test(c.innerText) && /accuracy pass/.test(c.innerText); }}""",
        timeout=240_000,
    )
    assert page.evaluate("window.__sameDocument") is True
    assert len(navigations) == before, navigations[before:]
    assert "s-succeeded" in cpu_cell.get_attribute("class")
    assert "✔ succeeded" in cpu_cell.inner_text()  # the state in text, not only in colour
    sm86_cell = page.locator(f"td.cell[data-target='{SM86}']")
    sm86_text = sm86_cell.inner_text()
    assert "engine" in sm86_text and "accuracy" in sm86_text
    # No worker here has an sm86 GPU: built, not measured, and not the green of a measured and checked engine.
    assert "✔ built · benchmark pending" in sm86_text and "s-built" in sm86_cell.get_attribute("class"), sm86_text
    # Once settled the matrix stops polling.
    page.wait_for_selector("#matrix[data-live='false']", timeout=60_000)
    assert errors == []
    yield {"context": context, "page": page, "model_id": model_id, "name": name, "build": build_link, "errors": errors}
    context.close()


def test_upload_build_and_watch_the_matrix_turn_green(built, farm, tmp_path):
    page = built["page"]
    # The build page: every task succeeded, with its time, its engine and its builder log.
    page.goto(f"{farm.url}{built['build']}")
    rows = page.locator("tr.task")
    assert rows.count() == 2
    for target in (CPU, SM86):
        row = page.locator(f"tr.task[data-target='{target}']")
        assert row.get_attribute("data-state") == "succeeded"
        assert re.search(r"built in \d+\.\d s", row.inner_text())
    assert page.locator("#tasks[data-live='false']").count() == 1
    shot(page, "build")
    # The engine page: fingerprint, the fetch command that picks it, and a download of the right bytes.
    page.click(f"tr.task[data-target='{SM86}'] a[href^='/ui/engines/']")
    page.wait_for_url(re.compile(r"/ui/engines/\d+$"))
    command = page.inner_text("#fetch-command")
    assert command.startswith(f"enginefarm fetch {built['name']} --version 1 --spec-hash ")
    assert "--cc 8.6" in command and "--trt-rtx " in command and f"--api {farm.url}" in command
    with page.expect_download() as info:
        page.click("a[download]")
    engine_id = int(page.url.rsplit("/", 1)[1])
    want = httpx.get(f"{farm.url}/v1/engines/{engine_id}", headers=farm.headers, timeout=30).json()["sha256"]
    assert hashlib.sha256(Path(info.value.path()).read_bytes()).hexdigest() == want
    # The command, run as shown (in a scratch folder), fetches exactly this engine.
    args = shlex.split(command)
    fetched = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ENGINEFARM_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    output = tmp_path / args[args.index("-o") + 1]
    assert hashlib.sha256(output.read_bytes()).hexdigest() == want
    # The CPU engine's page: its measurements per shape and its accuracy verdict.
    page.goto(f"{farm.url}{built['build']}")
    page.click(f"tr.task[data-target='{CPU}'] a[href^='/ui/engines/']")
    page.wait_for_url(re.compile(r"/ui/engines/\d+$"))
    bench = page.locator("#benchmarks tbody tr").first.locator("td, th").all_inner_texts()
    assert bench[0] == "opt" and re.fullmatch(r"\d+\.\d+ ms", bench[2]), bench
    assert "Verdict: pass" in page.inner_text("main")
    shot(page, "engine")


def test_report_chart_draws_the_measurements(built, farm, tmp_path):
    page = built["page"]
    # Version 2 of the model, built for the CPU with the same spec: its report compares with version 1.
    build_id = int(built["build"].rsplit("/", 1)[1])
    with Client(farm.url, token=farm.token) as client:
        spec = client.get(f"/v1/builds/{build_id}")["spec"]
        v2, created = client.upload(save_conv_net(tmp_path / "v2.onnx", seed=uuid.uuid4().int % 10_000), built["name"])
        assert created and v2["version"] == "2"
        done = client.wait_build(client.build(v2["id"], [CPU], spec)["id"], timeout=300)
        assert [t["state"] for t in done["tasks"]] == ["succeeded"], done
        client.wait_checks(v2["id"], timeout=300)
    page.goto(f"{farm.url}/ui/models/{v2['id']}")
    versions = page.locator("#matrix tbody th").all_inner_texts()
    assert versions == ["2", "1"]  # newest first, one row per version
    assert page.locator(f"td.cell[data-version='2'][data-target='{CPU}']").get_attribute("data-state") == "succeeded"
    assert page.locator(f"td.cell[data-version='2'][data-target='{SM86}']").count() == 0  # never built: no cell
    shot(page, "model")
    page.goto(f"{farm.url}/ui/models/{v2['id']}/report")
    page.wait_for_selector("#latency-figure[data-points]")
    drawn = page.evaluate("""() => Chart.getChart(document.getElementById('latency-chart')).data.datasets
        .map(d => ({label: d.label, data: d.data}))""")
    previous = next(d for d in drawn if d["label"] == "p50, version N-1")
    assert previous["data"] and all(v is not None and v > 0 for v in previous["data"])
    assert "vs version 1" in page.inner_text("h1")
    assert painted(page, P50_COLOUR) > 50 and painted(page, PREVIOUS_COLOUR) > 50  # both versions' bars drawn
    shot(page, "report")

    page.goto(f"{farm.url}/ui/models/{built['model_id']}/report")
    page.wait_for_selector("#latency-figure[data-points]")
    points = int(page.get_attribute("#latency-figure", "data-points"))
    assert points >= 1
    drawn = page.evaluate("""() => { const c = Chart.getChart(document.getElementById('latency-chart'));
        return {labels: c.data.labels, p50: c.data.datasets[0].data, sets: c.data.datasets.map(d => d.label)}; }""")
    assert drawn["sets"][:3] == ["p50", "p90", "p99"]
    assert any(CPU in label for label in drawn["labels"]) and all(v > 0 for v in drawn["p50"])
    assert painted(page, P50_COLOUR) > 50  # the bars are on the canvas
    with page.expect_download() as csv_file:
        page.click("#export-csv")
    lines = Path(csv_file.value.path()).read_text().splitlines()
    assert lines[0].startswith("model,version,engine_id,target")
    assert any(f",{CPU}," in line and ",measured," in line for line in lines[1:])
    with page.expect_download() as png_file:
        page.click("#export-png")
    assert Path(png_file.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_which_engine_for_an_sm86_machine(built, farm):
    page = built["page"]
    page.goto(f"{farm.url}/ui/resolve?model={built['name']}")
    assert page.input_value("#r-model") == built["name"]
    # The shapes field suggests this model's own inputs, at a shape they take.
    inputs = httpx.get(f"{farm.url}/v1/models/{built['model_id']}", headers=farm.headers, timeout=30).json()["inputs"]
    want = ",".join(
        f"{i['name']}:" + "x".join(str(d) if isinstance(d, int) else "4" for d in i["dims"]) for i in inputs
    )
    assert page.get_attribute("#r-shapes", "placeholder") == want
    assert page.get_attribute(f"#model-names option[value='{built['name']}']", "data-shapes") == want
    page.fill("#r-cc", "8.6")
    page.fill("#r-gpu", "NVIDIA GeForce RTX 3090")
    page.fill("#r-rtx", probe_modules()[0]["tensorrt_rtx"])
    page.select_option("#r-platform", "x86_64")
    page.click("#resolve-form button[type=submit]")
    page.wait_for_selector("#answer-engine")
    assert SM86 in page.inner_text("#answer-engine")
    rows = [page.locator("#explain-table tbody tr").nth(i).locator("td, th").all_inner_texts() for i in range(3)]
    # Every engine of both versions: the sm86 engine ranked; the CPU artifacts excluded, since a machine that names
    # TensorRT-RTX is not handed an ONNX Runtime file it did not ask for.
    assert page.locator("#explain-table tbody tr").count() == 3
    assert [r[0] for r in rows] == ["1", "excluded", "excluded"]
    assert SM86 in rows[0][1] and CPU in rows[1][1] and CPU in rows[2][1]
    assert [r[4] for r in rows[1:]] == ["named-runtime", "named-runtime"]
    assert re.fullmatch(r"\d+ checks", rows[0][-1])
    shot(page, "resolve")
    # The same machine as a pasted probe: `enginefarm worker --probe --json`.
    probe = (
        '{"hostname": "edge-1", "platform": "x86_64", "os": "Linux", "gpus": [{"index": 0, "name": '
        '"NVIDIA GeForce RTX 3090", "compute_capability": "8.6", "memory_mib": 24576}], "driver_version": '
        '"580.65", "cuda_version": "13.0", "jetson": null, "modules": {"tensorrt_rtx": "%s"}}'
        % probe_modules()[0]["tensorrt_rtx"]
    )
    page.fill("#r-cc", "")
    page.fill("#r-gpu", "")
    page.fill("#r-probe", probe)
    page.click("#resolve-form button[type=submit]")
    page.wait_for_selector("#answer-engine")
    assert SM86 in page.inner_text("#answer-engine")


def test_workers_page_lists_live_workers_and_queues(built, farm, tmp_path):
    page = built["page"]
    # A task for a target no worker of the session farm builds: it waits, and the page says for what.
    lonely = "tensorrt-rtx/sm75"
    with Client(farm.url, token=farm.token) as client:
        model, _ = client.upload(save_conv_net(tmp_path / "lonely.onnx", seed=4242), unique_name("ui-lonely"))
        client.build(model["id"], [lonely], sample_spec(), queue_without_worker=True)
    page.goto(f"{farm.url}/ui/workers")
    text = page.inner_text("#workers")
    assert "worker-a" in text and "worker-b" in text and SM86 in text
    assert re.search(
        rf"\d+ build task\(s\) for {lonely}, the oldest for \d+ s: no live worker builds it",
        page.inner_text("#orphans"),
    )
    # The sm86 engine built above waits for a GPU no worker here has: a note, not the alarm of a missing builder.
    assert "benchmark" not in page.inner_text("#orphans")
    assert re.search(rf"\d+ engine\(s\) for {SM86}, the oldest for \d+ s", page.inner_text("#unmeasured"))
    assert page.locator("#queues tr.unmeasured th", has_text=f"benchmark {SM86}").count() == 1  # not in alarm red
    # Other tests of the session may leave tasks of their own (a benchmark for sm75, say): only these rows count.
    row = page.locator("#queues tr.orphan th", has_text=f"build {lonely}")
    assert row.count() == 1 and page.locator("#queues tr.orphan", has_text=f"build {CPU}").count() == 0  # served
    shot(page, "workers")
    page.goto(f"{farm.url}/ui/tokens")
    assert "test-session" in page.inner_text("#tokens")
    shot(page, "tokens")
    page.goto(f"{farm.url}/ui/models")
    shot(page, "models")


def test_phone_width_has_no_sideways_scroll(built, farm, browser):
    context = browser.new_context(viewport=PHONE, storage_state=built["context"].storage_state())
    page = context.new_page()
    try:
        for path in (
            "/ui/models",
            f"/ui/models/{built['model_id']}",
            f"/ui/models/{built['model_id']}/report",
            "/ui/resolve",
            "/ui/workers",
        ):
            page.goto(f"{farm.url}{path}")
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"], (path, width)  # wide tables scroll inside their own box
        page.goto(f"{farm.url}/ui/models/{built['model_id']}")
        shot(page, "model-phone")
    finally:
        context.close()


# Targets no worker of the session farm serves (and no other test's worker): their tasks stay queued, cells drawn.
UNSERVED = [
    "tensorrt/sm87",
    "tensorrt/sm90",
    "onnxruntime/cuda-sm86",
    "onnxruntime/cuda-sm90",
    "onnxruntime/cpu-aarch64",
]


def test_a_wide_matrix_scrolls_inside_its_box(built, farm, browser, tmp_path):
    """Ten columns (five targets, two specs): the page itself never scrolls sideways, at 1280 or 1920 px; the matrix
    scrolls inside its own box where it is wider than the page."""
    with Client(farm.url, token=farm.token) as client:
        model, _ = client.upload(save_conv_net(tmp_path / "wide.onnx", seed=4343), unique_name("ui-wide"))
        for spec in (sample_spec(), {**sample_spec(), "workspace_mib": 1024}):
            client.build(model["id"], UNSERVED, spec, queue_without_worker=True)
    for width in (1280, 1920):
        context = browser.new_context(
            viewport={"width": width, "height": 900}, storage_state=built["context"].storage_state()
        )
        page = context.new_page()
        try:
            page.goto(f"{farm.url}/ui/models/{model['id']}")
            assert page.locator("#matrix thead th[data-target]").count() == 10
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            box = page.locator("#matrix .scroll")
            inner, outer = box.evaluate("e => [e.scrollWidth, e.clientWidth]")
            assert outer <= width and (inner <= outer or box.evaluate("e => getComputedStyle(e).overflowX") == "auto")
            shot(page, f"matrix-wide-{width}", full_page=False)
        finally:
            context.close()


def test_a_form_post_without_the_csrf_token_is_refused(built, farm):
    page, model_id = built["page"], built["model_id"]
    request = built["context"].request  # the signed-in browser's cookies, but not the page's token
    refused = request.post(f"{farm.url}/ui/models/{model_id}/builds", form={"targets": CPU, "precision": "fp32"})
    assert refused.status == 403 and "CSRF" in refused.text()
    refused = request.post(
        f"{farm.url}/ui/models/{model_id}/builds", form={"targets": CPU, "precision": "fp32", "csrf": "0" * 64}
    )
    assert refused.status == 403
    page.goto(f"{farm.url}/ui/models/{model_id}")
    builds = httpx.get(f"{farm.url}/v1/builds", params={"model_id": model_id}, headers=farm.headers, timeout=30).json()
    assert len(builds) == 1  # nothing was submitted by the refused posts


def test_another_projects_token_sees_none_of_the_models(built, farm, browser, tmp_path):
    suffix = uuid.uuid4().hex[:6]
    tokens = {}
    for project in (f"alpha-{suffix}", f"beta-{suffix}"):
        made = httpx.post(
            f"{farm.url}/v1/tokens",
            headers=farm.headers,
            timeout=30,
            json={"name": f"ui-{project}", "scopes": ["build"], "project": project},
        )
        assert made.status_code == 201, made.text
        tokens[project] = made.json()["token"]
    alpha, beta = tokens
    name = unique_name("ui-alpha")
    uploaded = httpx.post(
        f"{farm.url}/v1/models",
        headers={"Authorization": f"Bearer {tokens[alpha]}"},
        timeout=60,
        data={"name": name},
        files={"file": ("m.onnx", save_conv_net(tmp_path / "m.onnx").read_bytes())},
    )
    assert uploaded.status_code == 201, uploaded.text
    alpha_id = uploaded.json()["id"]

    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    try:
        sign_in(page, farm, tokens[beta])
        assert f"project beta-{suffix}" in page.inner_text("header")
        body = page.inner_text("#model-list")
        assert name not in body and built["name"] not in body and "No models" in body
        page.fill("#q", name)
        page.wait_for_function("() => /No models match/.test(document.getElementById('model-list').innerText)")
        answer = page.goto(f"{farm.url}/ui/models/{alpha_id}")
        assert answer.status == 404 and f"no model with id {alpha_id}" in page.inner_text("main")
        answer = page.goto(f"{farm.url}/ui/models/{built['model_id']}/report")
        assert answer.status == 404
        page.goto(f"{farm.url}/ui/resolve")
        assert page.locator("#model-names option").count() == 0
        assert page.locator("a[href='/ui/tokens']").count() == 0  # a build token is no admin
        assert page.goto(f"{farm.url}/ui/tokens").status == 403
    finally:
        context.close()
    # alpha's own browser session sees its model, and only it.
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    try:
        sign_in(page, farm, tokens[alpha])
        listed = page.locator("#model-list tbody th a").all_inner_texts()
        assert listed == [name]
    finally:
        context.close()


def test_sign_out_ends_the_session(built, farm):
    context, page = built["context"], built["page"]
    page.goto(f"{farm.url}/ui/models")
    cookie = next(c for c in context.cookies() if c["name"] == "ef_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert page.evaluate("document.cookie") == ""  # page scripts cannot read the session
    assert built["errors"] == []  # every page this session opened ran without a script error or CSP refusal
    page.click("header button:has-text('Sign out')")
    page.wait_for_url(re.compile(r"/ui/signin$"))
    page.goto(f"{farm.url}/ui/models")
    assert "/ui/signin" in page.url
    # The session was revoked on the server: the old cookie, replayed, opens nothing.
    replay = httpx.get(
        f"{farm.url}/ui/models", cookies={"ef_session": cookie["value"]}, timeout=30, follow_redirects=False
    )
    assert replay.status_code == 303 and replay.headers["location"].startswith("/ui/signin")
