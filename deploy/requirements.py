"""Print the requirements of the base install plus the given extras, read from pyproject.toml, one per line.

Used by the container builds to install the dependencies in a layer of their own, before the project's source is
copied in, so a change to the source rebuilds only the last small layer. An extra that names the project's own
extras (``enginefarm[server]``) is expanded. Python 3.11+ (tomllib).

    python3 deploy/requirements.py pyproject.toml server,worker,rtx > requirements.txt
"""

import re
import sys

import tomllib


def requirements(pyproject: str, extras: list[str]) -> list[str]:
    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    optional = project.get("optional-dependencies", {})
    reqs, seen, todo = list(project["dependencies"]), set(), list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"pyproject.toml has no extra '{extra}' (it has: {', '.join(sorted(optional))})")
        seen.add(extra)
        for req in optional[extra]:
            own = re.fullmatch(rf"{re.escape(project['name'])}\[([\w,\s-]+)\]", req.strip())
            if own:
                todo += [e.strip() for e in own.group(1).split(",")]
            elif req not in reqs:
                reqs.append(req)
    return reqs


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1], [e for e in sys.argv[2].split(",") if e])))
