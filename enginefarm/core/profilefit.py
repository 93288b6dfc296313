"""Whether an engine's optimization profiles cover the shapes a machine will run, and how tightly: the geometry
behind the compatibility rules' shape check (``enginefarm.core.compat``) and the ranking's narrowest-profile-first
(``enginefarm.core.choose``)."""

from __future__ import annotations

import math

from enginefarm.core.domain import EngineDescriptor
from enginefarm.core.shapes import format_dims


def span(rng: dict[str, list[int]]) -> str:
    return f"{format_dims(rng['min'])}..{format_dims(rng['max'])}"


def need(rng: dict[str, list[int]]) -> str:
    return format_dims(rng["min"]) if rng["min"] == rng["max"] else span(rng)


def profile_gap(
    i: int, profile: dict[str, dict[str, list[int]]], shapes: dict[str, dict[str, list[int]]]
) -> str | None:
    """Why profile ``i`` cannot run ``shapes``, or None when it covers every requested input."""
    for name, want in shapes.items():
        have = profile.get(name)
        if have is None:
            return f"profile {i} has no input {name!r} (it has {', '.join(sorted(profile)) or 'none'})"
        if len(have["min"]) != len(want["min"]) or not all(
            lo <= a and b <= hi for lo, a, b, hi in zip(have["min"], want["min"], want["max"], have["max"])
        ):
            return f"profile {i} of input {name!r} covers {span(have)}; you need {need(want)}"
    return None


def profile_covers(profile: dict[str, dict[str, list[int]]], shapes: dict[str, dict[str, list[int]]]) -> bool:
    """Whether one profile (input -> min/opt/max) covers every requested shape range."""
    return profile_gap(0, profile, shapes) is None


def profile_fit(profile: dict[str, dict[str, list[int]]], shapes: dict[str, dict[str, list[int]]]) -> tuple[int, float]:
    """How tightly a covering profile fits the request, smaller is better: first its width, the number of distinct
    shapes it admits for the requested inputs (the product over their dims of max - min + 1), then how far its opt
    lies from the request's opt (the sum over those dims of |log(opt / requested opt)|)."""
    width, distance = 1, 0.0
    for name, want in shapes.items():
        have = profile[name]
        for lo, hi in zip(have["min"], have["max"]):
            width *= hi - lo + 1
        distance += sum(abs(math.log(o / w)) for o, w in zip(have["opt"], want["opt"]))
    return width, distance


def shape_fit(e: EngineDescriptor, shapes: dict[str, dict[str, list[int]]]) -> tuple[int, float] | None:
    """The fit of the engine's best covering profile; None when the request names no shapes or the profiles
    are unknown."""
    fits = [profile_fit(p, shapes) for p in e.profiles if profile_covers(p, shapes)] if shapes else []
    return min(fits) if fits else None
