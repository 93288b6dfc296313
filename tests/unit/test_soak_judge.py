"""The soak's judge (bench/soak_judge.py) on series of known shape: a steady leak fails; a pool or cache filling
towards its bound, or a single step, does not, however steep its rise over the whole window."""

from __future__ import annotations

import json
import math

from bench.soak import rejudge
from bench.soak_judge import DAY, judge

MINUTE = 60.0


def samples(values) -> list[dict]:
    """One sample every 10 s for 80 minutes of a process ``api#1``: RSS in MB from ``values(t)``."""
    return [{"t": t, "series": {"rss_mb|api#1": values(t)}} for t in (i * 10.0 for i in range(481))]


def verdict_of(values) -> tuple[str, str]:
    (v,) = judge(samples(values), warmup_s=10 * MINUTE, horizon=DAY, by_design={})
    return v.verdict, v.why


def test_a_steady_leak_fails():
    # 150 MB, +8 MB an hour: doubles in under a day.
    assert verdict_of(lambda t: 150 + 8 * t / 3600)[0] == "FAIL"


def test_a_leak_in_steps_fails():
    # +2 MB every 10 minutes, the way a per-pass leak of a periodic job shows.
    assert verdict_of(lambda t: 150 + 2 * (t // 600))[0] == "FAIL"


def test_a_resource_that_stays_flat_passes():
    assert verdict_of(lambda t: 150 + 0.5 * math.sin(t / 100)) == ("ok", "")


def test_a_fill_towards_its_bound_is_not_a_leak():
    # Rises 40 MB towards 200 with a 15-minute time constant: its slope over the window after the warm-up
    # (+13 MB/h) would double it within a day, but its second half is nearly flat.
    verdict, why = verdict_of(lambda t: 200 - 40 * math.exp(-t / 900))
    assert verdict == "ok" and "one half only" in why


def test_a_single_step_is_not_a_leak():
    # A pool that opens one more 40 MB buffer at minute 30, then nothing.
    verdict, why = verdict_of(lambda t: 150 + (40 if t > 30 * MINUTE else 0))
    assert verdict == "ok" and "one half only" in why


def test_the_whole_window_slope_is_what_the_table_shows():
    (v,) = judge(samples(lambda t: 150 + 8 * t / 3600), warmup_s=10 * MINUTE, horizon=DAY, by_design={})
    assert abs(v.slope_h - 8.0) < 0.01


def test_a_saved_run_is_judged_again_by_the_judge_of_today(tmp_path, capsys):
    saved = {"mode": "embedded", "smoke": False, "seconds": 4800.0, "notes": ["t=2400 s: worker w SIGKILLed"]}
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(saved | {"samples": samples(lambda t: 200 - 40 * math.exp(-t / 900))}))
    assert rejudge(path) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith("rss_mb|api#1") and row.endswith("ok")
    assert row.split()[1] == "321"  # judged after the warm-up of a 80-minute run: its third
    path.write_text(json.dumps(saved | {"samples": samples(lambda t: 150 + 8 * t / 3600)}))
    assert rejudge(path) == 1


def test_a_life_too_short_after_its_warm_up_is_not_judged():
    """A process killed two minutes after its warm-up: too short a stretch to judge a daily slope by. The same
    steady rise judged over its whole life (15 minutes) still fails."""
    life = [{"t": t, "series": {"rss_mb|w.child2#7": 135 + 0.35 * t}} for t in range(0, 940, 10)]
    (short,) = judge(life, warmup_s=800, horizon=DAY, by_design={}, min_span_s=10 * MINUTE)
    assert short.verdict == "short" and "under 10 min" in short.why
    (whole,) = judge(life, warmup_s=0, horizon=DAY, by_design={}, min_span_s=10 * MINUTE)
    assert whole.verdict == "FAIL"


def lives(level_of_life) -> list[dict]:
    """A worker killed every 25 minutes over two hours (five lives, pids 1..5), none long enough to judge alone after
    a 40-minute warm-up; in each, RSS warms from 135 MB to ``level_of_life(i)`` and stays there."""
    out = []
    for t in (i * 10.0 for i in range(720)):
        i = int(t // 1500)
        warm = min((t - i * 1500) / 300, 1.0)
        out.append({"t": t, "series": {f"rss_mb|w.child2#{i + 1}": 135 + (level_of_life(i) - 135) * warm}})
    return out


def test_a_process_killed_before_its_warm_up_ends_is_judged_across_its_lives():
    """Each life alone is too short to judge; across lives, flat levels pass and a level that rises from life to life
    (a leak that outlives the process) fails."""
    flat = judge(lives(lambda i: 430), warmup_s=40 * MINUTE, horizon=DAY, by_design={}, min_span_s=10 * MINUTE)
    assert [v.verdict for v in flat if "lives" not in v.series] == ["short"]
    (across,) = [v for v in flat if "lives" in v.series]
    assert (across.series, across.verdict, across.points) == ("rss_mb|w.child2 (5 lives)", "ok", 5)
    rising = judge(lives(lambda i: 430 + 60 * i), warmup_s=40 * MINUTE, horizon=DAY, by_design={})
    (across,) = [v for v in rising if "lives" in v.series]
    assert across.verdict == "FAIL" and "rises from life to life" in across.why, across
