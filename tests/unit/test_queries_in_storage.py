"""Only storage queries the catalog's tables: the API and the worker call its functions, and take from
SQLAlchemy only the types those functions hand them (a Session, a plain Row) and its exceptions."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"sqlalchemy": {"Row"}, "sqlalchemy.orm": {"Session"}}  # and anything of sqlalchemy.exc


def sqlalchemy_imports(folder: str, root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [
                    f"{path.relative_to(root)}: import {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] == "sqlalchemy"
                ]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
                if node.module == "sqlalchemy.exc":
                    continue
                extra = {a.name for a in node.names} - ALLOWED.get(node.module, set())
                found += [f"{path.relative_to(root)}: from {node.module} import {n}" for n in sorted(extra)]
    return found


def test_the_api_and_the_worker_build_no_queries():
    assert sqlalchemy_imports("api") + sqlalchemy_imports("worker") == []


def test_the_check_sees_a_query_built_outside_storage(tmp_path):
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "gate.py").write_text(
        "from sqlalchemy import Row, select\nimport sqlalchemy.sql\nfrom sqlalchemy.exc import OperationalError\n"
    )
    assert sqlalchemy_imports("api", tmp_path) == [
        "api/gate.py: from sqlalchemy import select",
        "api/gate.py: import sqlalchemy.sql",
    ]
