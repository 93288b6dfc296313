"""Accuracy checks from the fleet: a deploy machine checks an engine against the farm's reference outputs and posts
its figures (``enginefarm measure``). The farm judges them again by the engine's gate; they count as the engine's
verdict only where its project's build spec says ``gate.accept_fleet_checks``, and a failing one then counts as a
failure. Another project's devices never touch this project's verdict. In process (TestClient) on PostgreSQL and
SQLite, the check rows written as a build writes them."""

from __future__ import annotations

import pytest

from enginefarm.core.spec import BuildSpec
from storage import checks
from storage.db import session_scope
from storage.tables import EngineRow, VerdictRow
from tests.e2e.api.test_measurements import GPU, QUERY, as_token, figure, post, resolve
from tests.e2e.api.test_measurements import farm as farm

PASSING = {"out": {"max_abs": 0.002, "cosine": 0.99999, "rel_l2": 0.001, "violations": 0.0}}
FAILING = {"out": {"max_abs": 3.0, "cosine": 0.4, "rel_l2": 0.9, "violations": 0.6}}


def checked(machine_id: str, outputs: dict, passed: bool) -> dict:
    return {**figure(machine_id, 1.0), "accuracy": {"passed": passed, "outputs": outputs, "inputs": "8 user samples"}}


def ask_checks(settings, engine_id: int, project: str, accept: bool) -> None:
    """The project builds with these check settings, as a build's worker records them (the gate's latest word)."""
    spec = BuildSpec(precision="fp16", gate={"accept_fleet_checks": accept})
    with session_scope(settings) as s:
        checks.ensure_benchmark_task(s, s.get(EngineRow, engine_id), spec, project)


def verdict(settings, engine_id: int, project: str) -> VerdictRow | None:
    with session_scope(settings) as s:
        row = checks.verdict_of(s, engine_id, project)
        if row is not None:
            s.expunge(row)
        return row


def test_a_fleet_check_is_the_engines_verdict_only_with_the_projects_consent(farm):
    settings, http, names, engines, tokens = farm
    fp16, measure, read = engines["fp16"], tokens["alpha", "measure"], tokens["alpha", "read"]
    ask_checks(settings, fp16, "alpha", accept=False)
    r = post(http, measure, fp16, checked("machine-0001", PASSING, True))
    assert r.status_code == 201 and r.json()["accuracy_pass"] is True, r.text
    # Without consent the check is kept and shown, and the engine still has no verdict.
    assert verdict(settings, fp16, "alpha") is None
    r = post(http, measure, fp16, checked("machine-0002", FAILING, False))
    assert r.status_code == 201 and r.json()["accuracy_pass"] is False, r.text
    assert verdict(settings, fp16, "alpha") is None
    listed = http.get(f"/v1/engines/{fp16}/measurements", headers=as_token(read)).json()["items"]
    assert [m["accuracy_pass"] for m in listed if m["source"] == "fleet"] == [True, False]

    # The project's next build says it takes fleet checks: a passing one is now the engine's verdict.
    ask_checks(settings, fp16, "alpha", accept=True)
    assert post(http, measure, fp16, checked("machine-0001", PASSING, True)).status_code == 201
    taken = verdict(settings, fp16, "alpha")
    assert taken is not None and taken.accuracy_pass is True
    assert taken.accuracy["source"] == "fleet" and taken.accuracy["fleet"]["gpu_name"] == GPU
    # Asked for engines that passed their check, this machine now gets it.
    r = http.get("/v1/resolve", params={**QUERY, "model": names["alpha"], "accuracy": "pass"}, headers=as_token(read))
    assert r.status_code == 200 and r.json()["engine"]["id"] == fp16, r.text

    # A machine whose check fails: the engine fails its gate, whatever the other machines said.
    assert post(http, measure, fp16, checked("machine-0003", FAILING, False)).status_code == 201
    failed = verdict(settings, fp16, "alpha")
    assert failed is not None and failed.accuracy_pass is False
    assert failed.accuracy["failures"]["out"], failed.accuracy
    # A later pass from another machine does not average the failure away.
    assert post(http, measure, fp16, checked("machine-0004", PASSING, True)).status_code == 201
    assert verdict(settings, fp16, "alpha").accuracy_pass is False
    answer = resolve(http, read, names["alpha"])
    assert answer["engine"]["id"] != fp16, answer


@pytest.mark.parametrize(
    ("outputs", "passed", "says"),
    [
        (FAILING, True, "says it passed, but its figures under the gate of fp16 say otherwise (out: "),
        (PASSING, False, "says it failed, but its figures under the gate of fp16 say otherwise (every figure is in"),
    ],
)
def test_a_check_whose_verdict_its_figures_deny_is_a_422(farm, outputs, passed, says):
    settings, http, _, engines, tokens = farm
    ask_checks(settings, engines["fp16"], "alpha", accept=True)
    r = post(http, tokens["alpha", "measure"], engines["fp16"], checked("machine-0009", outputs, passed))
    assert r.status_code == 422 and says in r.text, r.text
    assert r.json()["problems"][0]["loc"] == ["body", "accuracy"]
    assert verdict(settings, engines["fp16"], "alpha") is None
    listed = http.get(f"/v1/engines/{engines['fp16']}/measurements", headers=as_token(tokens["alpha", "read"]))
    assert [m for m in listed.json()["items"] if m["source"] == "fleet"] == []  # nothing half-written


def test_another_projects_device_never_touches_this_projects_verdict(farm):
    settings, http, names, engines, tokens = farm
    fp16 = engines["fp16"]
    ask_checks(settings, fp16, "alpha", accept=True)
    ask_checks(settings, fp16, "beta", accept=True)
    assert post(http, tokens["alpha", "measure"], fp16, checked("machine-0001", PASSING, True)).status_code == 201
    # Beta sees the same engine (the same bytes) and its device finds it failing: beta's verdict, not alpha's.
    assert post(http, tokens["beta", "measure"], fp16, checked("hostile-0001", FAILING, False)).status_code == 201
    assert verdict(settings, fp16, "alpha").accuracy_pass is True
    assert verdict(settings, fp16, "beta").accuracy_pass is False


def test_an_fp32_check_that_passes_only_with_tf32_off_is_judged_as_the_farm_judges_it(farm):
    """An fp32 engine on a GPU with TF32 misses the fp32 gate; run again with TF32 off it passes: the farm's own
    check calls that a pass explained by TF32, and a device's check with both sets of figures is judged the same."""
    settings, http, _, engines, tokens = farm
    fp32, measure = engines["fp32"], tokens["alpha", "measure"]
    ask_checks(settings, fp32, "alpha", accept=True)
    tf32_on = {"out": {"max_abs": 0.004, "cosine": 0.99999, "rel_l2": 0.001, "violations": 0.2}}
    tf32_off = {"out": {"max_abs": 3e-5, "cosine": 1.0, "rel_l2": 1e-6, "violations": 0.0}}
    alone = checked("machine-0001", tf32_on, True)
    r = post(http, measure, fp32, alone)
    assert r.status_code == 422 and "says it passed" in r.text, r.text  # without the TF32-off figures: not a pass
    both = {**alone, "accuracy": {**alone["accuracy"], "without_tf32": tf32_off}}
    r = post(http, measure, fp32, both)
    assert r.status_code == 201 and r.json()["accuracy_pass"] is True, r.text
    taken = verdict(settings, fp32, "alpha")
    assert taken.accuracy_pass is True and taken.accuracy["explained_by"] == "tf32", taken.accuracy
    assert "20% of elements" in taken.accuracy["tf32"]["failures_with_tf32"]["out"][0]
    worse = {"out": {**tf32_off["out"], "violations": 0.1}}  # wrong with TF32 off as well: a failure
    r = post(http, measure, fp32, {**alone, "accuracy": {**alone["accuracy"], "without_tf32": worse}})
    assert r.status_code == 422, r.text
