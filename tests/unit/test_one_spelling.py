"""A concept's values are spelled once, in its enum, and every list of them (a pattern, a form, a template, the
CLI's help) is derived from it: a precision added to the enum reaches all of them, and none lists an old set."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from api.ui.render import templates
from enginefarm.client.cli import app
from enginefarm.core.domain import Backend
from enginefarm.core.spec import PRECISIONS, Precision
from enginefarm.core.wanted import BACKEND_PATTERN, PRECISION_PATTERN

ROOT = Path(__file__).resolve().parents[2]


def test_the_patterns_take_exactly_the_enums_values():
    assert PRECISIONS == tuple(p.value for p in Precision)
    assert all(re.match(PRECISION_PATTERN, p) for p in PRECISIONS)
    assert not re.match(PRECISION_PATTERN, "fp61") and not re.match(PRECISION_PATTERN, "fp16x")
    assert all(re.match(BACKEND_PATTERN, b.value) for b in Backend)
    assert not re.match(BACKEND_PATTERN, "tensorrt-llm")


def test_the_dashboards_build_form_offers_the_enums_precisions():
    assert templates.env.globals["precisions"] is PRECISIONS
    assert "{% for p in precisions %}" in (ROOT / "api" / "ui" / "templates" / "model.html").read_text()


def test_no_template_or_module_lists_the_precisions_by_hand():
    literal = re.compile(r"""["']fp32["'],\s*["']fp16["'],\s*["']bf16["']""")
    found = [
        str(p.relative_to(ROOT))
        for folder in ("api", "enginefarm", "server", "worker")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".html") and literal.search(p.read_text())
    ]
    assert found == []


def test_the_clis_help_names_every_precision():
    for command in ("build", "ci"):
        out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
        text = " ".join(out.split())
        assert all(p in text for p in PRECISIONS), (command, text[:400])
