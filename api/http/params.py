"""What a request may name, as the routes and the dashboard check it: catalog ids, page offsets, storable text; and
the 422 every route may answer."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path
from fastapi.exceptions import RequestValidationError

from api.schemas import ErrorOut
from enginefarm.core.text import text_problem

# A 422 is either FastAPI's request validation or the farm's own (ModelRejected, SpecInvalid): ErrorOut is both.
UNPROCESSABLE: dict[int | str, dict[str, Any]] = {422: {"model": ErrorOut, "description": "the request is invalid"}}

# Catalog ids are 32-bit integers: a larger one names no row, and the database refuses to compare it.
ID_MAX = (1 << 31) - 1
RowId = Annotated[int, Path(ge=1, le=ID_MAX)]


def page_offset(offset: int) -> int:
    """An offset the database can take; past the last row the page is simply empty."""
    return max(0, min(offset, ID_MAX))


def invalid(loc: tuple[str, ...], value: Any, msg: str, kind: str = "value_error") -> RequestValidationError:
    """The 422 of a request whose value at ``loc`` does not validate, as FastAPI words its own."""
    return RequestValidationError([{"type": kind, "loc": loc, "input": value, "msg": msg}])


def check_body_id(name: str, value: int) -> None:
    """Reject a JSON body's id outside 1..ID_MAX with the same 422 a path id gets."""
    if not 1 <= value <= ID_MAX:
        raise invalid(("body", name), value, f"Input should be between 1 and {ID_MAX}", "int_range")


def check_no_nul(where: str, **values: Any) -> None:
    """Reject text the catalog cannot store (a NUL, a lone surrogate) in query parameters, with the same 422 a
    ``CatalogText`` field of a body gets: no stored name has one, and PostgreSQL text cannot hold it."""
    errors = [
        {"type": "string_unstorable", "loc": (where, name), "msg": f"Value {problem}"}
        for name, value in values.items()
        if isinstance(value, str) and (problem := text_problem(value))
    ]
    if errors:
        raise RequestValidationError(errors)
