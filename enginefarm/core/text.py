"""Text the catalog can store, as one type every request field that reaches the catalog is declared with.

PostgreSQL's text cannot hold NUL (U+0000), and no UTF-8 database can hold a lone surrogate (U+D800..U+DFFF, which
a JSON body can spell as ``"\\ud800"``): such a value failed at the database, as a 500, after the request had been
taken. ``CatalogText`` refuses it where the request is validated, as a 422 that names the field, on SQLite as on
PostgreSQL.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError


def text_problem(value: str) -> str | None:
    """Why the catalog cannot store ``value``, or None."""
    if value.isascii():  # the common case, checked in C
        return "must not contain a NUL character" if "\x00" in value else None
    if "\x00" in value:
        return "must not contain a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must not contain a lone surrogate (U+D800..U+DFFF): it is not text in any encoding"
    return None


def _storable(value: str) -> str:
    if problem := text_problem(value):
        raise PydanticCustomError("string_unstorable", "Value {problem}", {"problem": problem})
    return value


CatalogText = Annotated[str, AfterValidator(_storable)]
