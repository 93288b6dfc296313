"""Debian's Chromium under Playwright: installed by deploy/browser.sh when missing, started headless."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"


@contextmanager
def launch_chromium() -> Iterator:
    """A headless Chromium (Playwright's own browser download is not reachable from every machine)."""
    from playwright.sync_api import sync_playwright

    subprocess.run(["bash", str(ROOT / "deploy" / "browser.sh")], check=True, capture_output=True, timeout=900)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
        try:
            yield browser
        finally:
            browser.close()
