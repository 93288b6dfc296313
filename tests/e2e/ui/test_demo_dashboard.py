"""What a new user sees after the demo: ``python -m server.demoserve`` (the code behind
``enginefarm demo --serve``) runs the demo, keeps its farm serving, and prints the dashboard's address and a token.
In a real browser: sign in with it, find the demo's model, its build matrix, its report chart and the resolver."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from server.embedded import free_port
from tests.browser import launch_chromium
from tests.e2e.ui.test_dashboard import DESKTOP, shot

DEMO_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def demo_farm(tmp_path_factory):
    """The served demo: (dashboard URL, token). Stopped with SIGTERM, as a service manager stops it."""
    data = tmp_path_factory.mktemp("demo-serve")
    out = data / "stdout.log"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "server.demoserve",
                "--data-dir",
                str(data / "farm"),
                "--port",
                str(free_port()),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + DEMO_TIMEOUT_S
        while not re.search(r"ENGINEFARM_TOKEN=\S+", text := out.read_text(errors="replace")):
            assert proc.poll() is None, f"the demo ended with {proc.returncode}:\n{text[-3000:]}"
            assert time.monotonic() < deadline, f"the demo did not serve within {DEMO_TIMEOUT_S} s:\n{text[-3000:]}"
            time.sleep(1)
        url = re.search(r"ENGINEFARM_UI=(\S+)", text).group(1)
        yield url, re.search(r"ENGINEFARM_TOKEN=(\S+)", text).group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=60) == 0  # it stops its farm and exits cleanly
        finally:
            if proc.poll() is None:
                proc.kill()


def test_after_the_demo_a_new_user_sees_model_matrix_report_and_resolver(demo_farm):
    url, token = demo_farm
    with launch_chromium() as browser:
        page = browser.new_page(viewport=DESKTOP)
        page.goto(url)
        assert "/ui/signin" in page.url
        page.fill("#token", token)
        page.click("form button[type=submit]")
        page.click("#model-list a:has-text('convnet')")
        page.wait_for_url(re.compile(r"/ui/models/\d+$"))
        cells = page.locator("#matrix td.cell")
        states = cells.evaluate_all("els => els.map(e => [e.dataset.target, e.dataset.state])")
        assert dict(states).get("onnxruntime/cpu-x86_64") == "succeeded"
        assert all(state == "succeeded" for _, state in states) and len(states) in (1, 5)  # 5 with TensorRT-RTX
        assert "accuracy pass" in page.locator("td.cell[data-target='onnxruntime/cpu-x86_64']").inner_text()
        shot(page, "demo-model")
        page.click("a:has-text('Latency report')")
        page.wait_for_selector("#latency-figure[data-points]")
        assert int(page.get_attribute("#latency-figure", "data-points")) >= 3  # batch 1, 4 and 8
        shot(page, "demo-report")
        page.click("a:has-text('Which engine?')")
        page.fill("#r-model", "convnet")
        page.fill("#r-cc", "8.6")
        page.select_option("#r-platform", "x86_64")
        page.click("#resolve-form button[type=submit]")
        page.wait_for_selector("#answer-engine")
        answer = page.inner_text("#answer-engine")
        assert "tensorrt-rtx/sm86" in answer or (len(states) == 1 and "onnxruntime" in answer)
        shot(page, "demo-resolve")
