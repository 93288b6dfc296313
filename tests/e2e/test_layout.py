"""The package's layout: imports point down (import-linter contracts in pyproject.toml), every kernel module is
under the kernel's contract, and the client and kernel run on Python 3.10 (vermin)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

from server.cli import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BIN = Path(sys.executable).parent


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports over a checkout, run from its root: the folders are the packages."""
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env={"PATH": str(BIN), "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_imports_point_down():
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "6 kept, 0 broken" in out.stdout, out.stdout[-2000:]


def test_the_contracts_catch_an_import_that_points_up(tmp_path):
    for name in (*PACKAGES, "pyproject.toml"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, tmp_path / name)
    with open(tmp_path / "enginefarm" / "core" / "domain.py", "a") as f:
        f.write("\nfrom storage import db  # noqa\n")
    with open(tmp_path / "api" / "services" / "builds.py", "a") as f:
        f.write("\nfrom worker import pipeline  # noqa\n")
    with open(tmp_path / "api" / "ui" / "farm.py", "a") as f:
        f.write("\nfrom api.routes import tokens  # noqa\n")
    with open(tmp_path / "enginefarm" / "measure" / "ort_runner.py", "a") as f:
        f.write("\nimport onnx  # noqa\n")
    out = lint_imports(tmp_path)
    assert out.returncode == 1
    assert "enginefarm.core.domain -> storage.db" in out.stdout
    assert "api.services.builds -> worker.pipeline" in out.stdout
    assert "api.ui.farm -> api.routes.tokens" in out.stdout  # the dashboard calls services, never a route
    assert "enginefarm.measure.ort_runner -> onnx" in out.stdout  # a deploy machine's runner needs no onnx


def test_every_kernel_module_is_under_the_kernel_contract():
    """The kernel is enginefarm.core, whole; enginefarm/ holds only its own __init__ and __main__, beside the
    kernel, the graph, the client and the runners."""
    contract = next(c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["name"].startswith("The kernel"))
    assert contract["source_modules"] == ["enginefarm.core"]
    assert {p.name for p in (ROOT / "enginefarm").glob("*.py")} == {"__init__.py", "__main__.py"}
    assert {p.name for p in (ROOT / "enginefarm").iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "core",
        "client",
        "graph",
        "measure",
    }


def test_a_folders_path_is_its_import_name():
    """No package-dir mapping: what installs is the checkout's folders under their own names, and nothing else."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert "package-dir" not in setuptools and set(setuptools["packages"]) == {"find"}
    assert {p.rstrip("*") for p in setuptools["packages"]["find"]["include"]} == set(PACKAGES)
    assert set(PYPROJECT["tool"]["importlinter"]["root_packages"]) == set(PACKAGES)


def test_the_farm_runs_from_the_checkouts_root():
    """`python -m enginefarm` from the root imports the checkout's folders, the farm's commands included."""
    out = subprocess.run(
        [sys.executable, "-m", "enginefarm", "up", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--data-dir" in out.stdout


def test_client_kernel_and_runners_run_on_python_3_10():
    files = [
        str(ROOT / "enginefarm" / "__init__.py"),
        str(ROOT / "enginefarm" / "__main__.py"),
        str(ROOT / "enginefarm" / "core"),
        str(ROOT / "enginefarm" / "client"),
        str(ROOT / "enginefarm" / "measure"),
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
    for folder in (*PACKAGES, "tests", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.level == 0
                    and (node.module or "").split(".")[0] in PACKAGES
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
                        if alias.name.split(".")[0] in PACKAGES:
                            try:
                                importlib.import_module(alias.name)
                            except ImportError as exc:
                                broken.append(f"{path.relative_to(ROOT)}:{node.lineno}: {exc}")
    assert not broken, "\n".join(broken)
