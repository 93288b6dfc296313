"""Names the catalog, file names, URLs and Triton repositories share: a project, a model's name and its version.
One rule for uploads, tokens and the CLI."""

from __future__ import annotations

import string
import unicodedata
from typing import Any

from enginefarm.core.errors import problem

NAME_MAX = 200
VERSION_MAX = 100
PROJECT_MAX = 64
# Versions that resolve and fetch read as selectors rather than as a version's name.
RESERVED_VERSIONS = frozenset({"latest"})
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "-_.")
_SHOWN_CHARS = 5


def _odd_characters(value: str, allowed: frozenset[str]) -> str:
    """The characters of ``value`` outside ``allowed``, each with its code point and Unicode name, so a look-alike
    (a Cyrillic 'а' in 'teаm') shows what it really is."""
    odd = list(dict.fromkeys(c for c in value if c not in allowed))
    shown = ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}" for c in odd[:_SHOWN_CHARS])
    return shown + (f" and {len(odd) - _SHOWN_CHARS} more" if len(odd) > _SHOWN_CHARS else "")


def name_problem(what: str, value: str, max_len: int, extra: str = "") -> str | None:
    """Why ``value`` cannot be a project, model name or version, or None. These end up in file names, URLs and
    Triton model repositories, so they are plain ASCII (no look-alike letters), and start with a letter or digit,
    which also rules out '.', '..', hidden names and ones a shell would read as an option."""
    allowed = _NAME_CHARS | frozenset(extra)
    chars = "letters, digits, '-', '_'" + "".join(f", '{c}'" for c in extra) + " or '.'"
    rule = f"{what} must be 1-{max_len} ASCII {chars}, starting with a letter or digit"
    if not 1 <= len(value) <= max_len:
        return f"{rule}; this one has {len(value)} characters"
    if not set(value) <= allowed:
        return f"{rule}; not allowed here: {_odd_characters(value, allowed)}"
    if not (value[0].isascii() and value[0].isalnum()):
        return f"{rule}; {value!r} starts with {value[0]!r}"
    return None


def project_problem(project: str) -> str | None:
    """Why ``project`` cannot name a project, or None: the one rule for uploads, tokens and the CLI."""
    return name_problem("project", project, PROJECT_MAX)


def check_model_name(name: str | None, version: str | None) -> list[dict[str, Any]]:
    """Problems with an upload's model name and version, as validation problems (none when both are fine)."""
    problems = []
    if not name or not name.strip():
        problems.append(problem(["name"], "give the model a 'name'"))
    elif msg := name_problem("name", name, NAME_MAX):
        problems.append(problem(["name"], msg))
    if version is not None:
        if msg := name_problem("version", version, VERSION_MAX, extra="+"):
            problems.append(problem(["version"], msg))
        elif version.lower() in RESERVED_VERSIONS:
            newest = f"resolve and fetch read '{version.lower()}' as the newest version"
            other = "choose another version, or leave it out to get the next number"
            problems.append(problem(["version"], f"version {version!r} is reserved: {newest}; {other}"))
    return problems


def upload_problems(name: str | None, version: str | None, project: str | None) -> list[dict[str, Any]]:
    """Problems with an upload's form fields (name, version, project), as validation problems: what the farm refuses
    after the upload (``api.services.ingest``) and the client checks before sending a byte."""
    problems = check_model_name(name, version)
    if project and (why := project_problem(project)):
        problems.append(problem(["project"], why))
    return problems
