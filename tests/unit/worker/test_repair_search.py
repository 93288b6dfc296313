"""The search a repair runs along its ranking: where it starts, how much it trims, and the count of top groups that
covers a set (worker/repair.py). The judge here is the gate's rule on a known set of needed layers."""

from __future__ import annotations

from worker.repair import groups_covering, search, within

GROUPS = [["a"], ["b"], ["c"], ["d", "e"], ["f"], ["g"], ["h"], ["i"]]


class _Gate:
    """Passes when every needed layer is kept; the cosine grows with the needed layers kept."""

    def __init__(self, needed: set[str]):
        self.needed, self.tried = needed, []

    def __call__(self, layers: list[str]) -> dict:
        self.tried.append(list(layers))
        share = len(self.needed & set(layers)) / len(self.needed)
        return {"pass": self.needed <= set(layers), "cosine": round(0.9 + 0.1 * share, 6)}


def test_search_from_the_start_it_is_given_skips_the_smaller_sets():
    gate = _Gate({"a", "f"})
    kept, figure = search(GROUPS, budget=8, judge=gate, base=[], start=4)
    assert gate.tried[0] == within(GROUPS, 8, 4)  # the top 4 groups first, not the top 1, 2
    assert figure["pass"] is True and set(kept) >= {"a", "f"}
    from_one = _Gate({"a", "f"})
    assert search(GROUPS, budget=8, judge=from_one, base=[])[0] == kept
    assert len(from_one.tried) > len(gate.tried)  # the same set, found with fewer checks


def test_search_trims_at_most_the_tries_it_is_given():
    gate = _Gate({"h"})
    kept, figure = search(GROUPS, budget=9, judge=gate, base=[], trims=2)
    assert figure["pass"] is True and "h" in kept
    assert len(gate.tried) == 4 + 2  # the top 1, 2, 4 and 8 groups, then two drops
    untrimmed = _Gate({"h"})
    assert search(GROUPS, budget=9, judge=untrimmed, base=[])[0] == ["h"]
    assert len(untrimmed.tried) == 4 + 8  # every group but "h" dropped, one try each


def test_groups_covering_counts_the_top_groups_that_hold_a_set():
    assert groups_covering(GROUPS, 8, ["a"]) == 1
    assert groups_covering(GROUPS, 8, ["e", "b"]) == 4  # "e" comes with the fourth group
    assert groups_covering(GROUPS, 3, ["f"]) == len(GROUPS)  # beyond the budget: every group
