"""The search an accuracy repair runs once its layers are ranked, shared by int8 (worker/int8/repair.py) and fp16
(worker/fp16/repair.py): the layers of the top 1, 2, 4, ... ranked groups are kept in float until the gate passes,
within a budget of a quarter of the candidate layers; then each kept group the gate does not need is dropped again,
least sensitive first. ``judge(layers)`` returns a gate figure (``pass`` and the figures ``score`` orders by)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

# The share of the candidate layers that may be kept in float before the repair gives up.
BUDGET = 0.25
# At most this many single-group drops are tried after a passing set is found.
TRIM_TRIES = 8
RANKING_SHOWN = 20


def budget_of(candidates: int) -> int:
    """The most layers a repair may keep in float, of ``candidates`` it could keep."""
    return max(1, int(candidates * BUDGET))


def by_cosine(figure: dict[str, Any]) -> float:
    return figure["cosine"]


def not_needed(report: dict[str, Any], before: dict[str, Any], judge: Timed, started: float) -> dict[str, Any]:
    """The repair report of a model whose reduced-precision artifact already passes its gate: nothing kept."""
    return {**report, "needed": False, "passed": True, "kept": [], "after": before, **judge.cost(started)}


class Timed:
    """A repair's judge whose real checks (the calls that raised its ``calls``; not those answered from a cache)
    are timed; everything else is the judge's own."""

    def __init__(self, judge: Any):
        self._judge = judge
        self.durations: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._judge, name)

    def __call__(self, keep: list[str], **options: Any) -> dict[str, Any]:
        calls, started = self._judge.calls, time.perf_counter()
        out = self._judge(keep, **options)
        if self._judge.calls > calls:
            self.durations.append(time.perf_counter() - started)
        return out

    def cost(self, started: float) -> dict[str, Any]:
        """The repair's real checks, its wall time since ``started`` (``time.perf_counter``), that of one accuracy
        check of the model (quantize or convert, build, run on the gate's inputs, judge: the median of the repair's
        own), and the repair's cost in such checks."""
        seconds = time.perf_counter() - started
        check = statistics.median(self.durations) if self.durations else 0.0
        return {
            "evaluations": self._judge.calls,
            "seconds": round(seconds, 2),
            "check_seconds": round(check, 4),
            "cost_in_checks": round(seconds / check, 1) if check > 0 else None,
        }


def within(groups: list[list[str]], budget: int, count: int | None = None) -> list[str]:
    """The layers of the first ``count`` groups (all when None), in ranking order, the groups that fit the budget."""
    out: list[str] = []
    for group in groups[:count]:
        grown = out + [n for n in group if n not in out]
        if len(grown) <= budget:  # a group that does not fit is passed over
            out = grown
    return out


def groups_covering(groups: list[list[str]], budget: int, layers: list[str]) -> int:
    """How many of the top groups ``search`` takes to keep at least ``layers`` (all of them when none does)."""
    for count in range(1, len(groups) + 1):
        if set(layers) <= set(within(groups, budget, count)):
            return count
    return len(groups)


def search(
    groups: list[list[str]],
    budget: int,
    judge: Callable[[list[str]], dict[str, Any]],
    base: list[str],
    score: Callable[[dict[str, Any]], Any] = by_cosine,
    start: int = 1,
    trims: int = TRIM_TRIES,
) -> tuple[list[str] | None, dict]:
    """Grow the kept set along the ranking (the layers of the top ``start``, then twice as many, ... groups, at most
    ``budget`` layers), then drop each group's layers that the gate does not need, least sensitive first, in at most
    ``trims`` tries. ``score``: the higher, the better a figure (the best one is returned when nothing passes)."""
    best: dict = {}
    found: list[str] | None = None
    tried: list[list[str]] = []
    count = max(1, start)
    while True:
        keep = within(groups, budget, count)
        if keep and keep not in tried:
            tried.append(keep)
            figure = judge([*base, *keep])
            if not best or score(figure) > score(best):
                best = figure
            if figure["pass"]:
                found, best = keep, figure
                break
        if count >= len(groups) or len(keep) >= budget or within(groups, budget, count * 2) == keep:
            break
        count *= 2
    if found is None:
        return None, best
    chosen = [g for g in groups if set(g) <= set(found)]
    tries = 0
    for group in list(reversed(chosen)):  # least sensitive first
        rest = [g for g in chosen if g is not group]
        trial = within(rest, budget)
        if not trial or len(trial) == len(found):
            continue
        if tries >= trims:
            break
        tries += 1
        figure = judge([*base, *trial])
        if figure["pass"]:
            found, best, chosen = trial, figure, rest
    return found, best
