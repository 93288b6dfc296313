"""The dashboard's repair fragment for an int8 repair that passed by a CPU form (no set of layers within the budget
passed): rendered by the dashboard's own templates from the API's schema (api/schemas/int8.py), it says which form
passed and why, and keeps no layer; a stop without a passing form still reads as failed."""

from __future__ import annotations

from api.schemas.int8 import _repair
from api.ui.render import templates

FORM_NOTE = (
    "no set of up to 1 of the 6 quantized layers kept in float passes the int8 gate with the operator form (best "
    "cosine 0.9000 against fp32); the convolutions form passes as it is (cosine 0.9990): operator format on "
    "convolutions only"
)


def _report(**changes) -> dict:
    figure = {"pass": True, "cosine": 0.999}
    return {
        "recipe": "operator",
        "needed": True,
        "passed": True,
        "kept": [],
        "before": {"pass": False, "cosine": 0.9},
        "after": figure,
        "budget": 1,
        "forms": {"convolutions": figure},
        "form": "convolutions",
        "note": FORM_NOTE,
        "evaluations": 4,
        **changes,
    }


def _rendered(report: dict) -> str:
    macro = templates.env.get_template("fragments/repair.html").module.repair_view
    return str(macro(_repair(report), [], "t"))


def test_a_repair_passed_by_form_names_the_form_and_keeps_no_layer():
    html = _rendered(_report())
    assert "repaired by form: the convolutions form passes the int8 gate as it is;" in html, html
    assert "no set of up to 1 of the 6 quantized layers" in html and "<strong>failed</strong>" not in html
    assert 'id="repair-kept-t">none<' in html
    schema = _repair(_report())
    assert schema.form == "convolutions" and schema.forms is not None and schema.forms["convolutions"].passed


def test_a_stop_without_a_passing_form_still_reads_as_failed():
    stopped = _report(passed=False, form=None, forms={"convolutions": {"pass": False, "cosine": 0.95}})
    stopped["note"] = "no set of up to 1 ... passes the int8 gate (best cosine 0.9000 against fp32; the convolutions "
    html = _rendered(stopped)
    assert "<strong>failed</strong>" in html and "repaired by form" not in html, html


def test_a_repair_not_needed_names_the_form_it_judged_not_the_one_kept():
    """The repair judges the operator form before the CPU candidates are measured; when that passes, the kept
    artifact may be another form (dense-convolutions, with its own cosine). The dashboard and the terminal say which
    form the repair judged, so its cosine is not read as the shipped artifact's."""
    from enginefarm.client.int8view import outcome_line

    report = _report(needed=False, passed=True, form=None, forms=None, before={"pass": True, "cosine": 0.9985})
    assert "not needed: the operator form passed its accuracy gate as quantized" in _rendered(report)
    line = outcome_line(_repair(report).model_dump()).plain
    assert "the operator form passes the int8 gate as quantized (cosine 0.9985)" in line, line
    assert "the CPU form kept was gated on its own" in line
