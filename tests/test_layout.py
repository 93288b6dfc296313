"""The package's layout: imports point down (import-linter contracts in pyproject.toml), every kernel module is
under the kernel's contract, and the client and kernel run on Python 3.10 (vermin)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BIN = Path(sys.executable).parent


def installed_layout(dest: Path) -> Path:
    """The packages as an install lays them out (pyproject's package-dir: api/ → enginefarm/api, ...)."""
    for package, folder in sorted(PYPROJECT["tool"]["setuptools"]["package-dir"].items()):
        shutil.copytree(
            ROOT / folder,
            dest.joinpath(*package.split(".")),
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    return dest


def lint_imports(layout: Path) -> subprocess.CompletedProcess:
    # From the layout's folder, so the checkout's own enginefarm/ (without api/ etc.) is not the one analysed.
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=layout,
        env={"PATH": str(BIN), "PYTHONPATH": str(layout)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_imports_point_down(tmp_path):
    out = lint_imports(installed_layout(tmp_path))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "4 kept, 0 broken" in out.stdout, out.stdout[-2000:]


def test_the_contracts_catch_an_import_that_points_up(tmp_path):
    layout = installed_layout(tmp_path)
    with open(layout / "enginefarm" / "core" / "domain.py", "a") as f:
        f.write("\nfrom enginefarm.storage import db  # noqa\n")
    with open(layout / "enginefarm" / "api" / "services.py", "a") as f:
        f.write("\nfrom enginefarm.worker import pipeline  # noqa\n")
    out = lint_imports(layout)
    assert out.returncode == 1
    assert "enginefarm.core.domain -> enginefarm.storage.db" in out.stdout
    assert "enginefarm.api.services -> enginefarm.worker.pipeline" in out.stdout


def test_every_kernel_module_is_under_the_kernel_contract():
    """The kernel is enginefarm.core, whole; the package root holds only its own __init__ and __main__, beside the
    kernel, the client, graph and server folders."""
    contract = next(c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["name"].startswith("The kernel"))
    assert contract["source_modules"] == ["enginefarm.core"]
    assert {p.name for p in (ROOT / "enginefarm").glob("*.py")} == {"__init__.py", "__main__.py"}
    assert {p.name for p in (ROOT / "enginefarm").iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "core",
        "client",
        "graph",
        "server",
    }


def test_no_top_level_package_but_enginefarm():
    assert [p for p in PYPROJECT["tool"]["setuptools"]["packages"] if not p.startswith("enginefarm")] == []
    assert set(PYPROJECT["tool"]["setuptools"]["package-dir"]) == {
        "enginefarm",
        "enginefarm.api",
        "enginefarm.worker",
        "enginefarm.storage",
    }


def test_client_and_kernel_run_on_python_3_10():
    files = [
        str(ROOT / "enginefarm" / "__init__.py"),
        str(ROOT / "enginefarm" / "__main__.py"),
        str(ROOT / "enginefarm" / "core"),
        str(ROOT / "enginefarm" / "client"),
    ]
    out = subprocess.run(
        [str(BIN / "vermin"), "--no-tips", "--eval-annotations", "--target=3.10-", "--violations", *files],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_vermin_catches_a_3_11_feature(tmp_path):
    (tmp_path / "m.py").write_text("from enum import StrEnum\n")
    out = subprocess.run(
        [str(BIN / "vermin"), "--no-tips", "--target=3.10-", "--violations", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "StrEnum" in out.stdout


def test_every_import_of_the_project_resolves():
    """Imports inside functions run only when called: each one names a module and names that exist."""
    import ast
    import importlib

    broken = []
    for folder in ("enginefarm", "api", "worker", "storage", "tests", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.level == 0
                    and (node.module or "").startswith("enginefarm")
                ):
                    try:
                        module = importlib.import_module(node.module)
                    except ImportError as exc:
                        broken.append(f"{path.relative_to(ROOT)}:{node.lineno}: {exc}")
                        continue
                    for alias in node.names:
                        if alias.name != "*" and not hasattr(module, alias.name):
                            try:
                                importlib.import_module(f"{node.module}.{alias.name}")
                            except ImportError:
                                broken.append(
                                    f"{path.relative_to(ROOT)}:{node.lineno}: {node.module} has no {alias.name}"
                                )
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.startswith("enginefarm"):
                            try:
                                importlib.import_module(alias.name)
                            except ImportError as exc:
                                broken.append(f"{path.relative_to(ROOT)}:{node.lineno}: {exc}")
    assert not broken, "\n".join(broken)
