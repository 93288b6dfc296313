"""Text the catalog can store, as one type every request field that reaches the catalog is declared with.

PostgreSQL's text cannot hold NUL (U+0000), and no UTF-8 database can hold a lone surrogate (U+D800..U+DFFF, which
a JSON body can spell as ``"\\ud800"``). ``CatalogText`` refuses either where the request is validated, as a 422 that
names the field, on SQLite as on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema
from pydantic_core import PydanticCustomError


def text_problem(value: str) -> str | None:
    """Why the catalog cannot store ``value``, or None."""
    if "\x00" in value:
        return "must not contain a NUL character"
    if not value.isascii():  # ASCII, the common case, is checked in C
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


def _at_most(limit: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        if len(value) > limit:
            raise PydanticCustomError(
                "string_too_long", "String should have at most {max_length} characters", {"max_length": limit}
            )
        return value

    return check


# CatalogText with its length inside the type: a max_length on an optional field (``CatalogText | None``) cannot
# reach the annotated str inside and reports a list's "items", and a length checked before the storable check
# reports a lone surrogate as unparsable rather than saying what is wrong with it.
Name = Annotated[
    str, AfterValidator(_storable), AfterValidator(_at_most(200)), WithJsonSchema({"type": "string", "maxLength": 200})
]
VersionText = Annotated[
    str, AfterValidator(_storable), AfterValidator(_at_most(100)), WithJsonSchema({"type": "string", "maxLength": 100})
]
