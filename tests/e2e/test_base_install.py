"""`pip install enginefarm` (no extras) is the client: a fresh venv gets no server dependency, the client commands
work, a farm command names the extra it needs, and it runs on Python 3.10 (JetPack 6) as well as 3.11.

Prints the install's size and package count (docs/performance.md records them)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import python

ROOT = Path(__file__).resolve().parents[2]
# What the base install must never pull in: the farm's own dependencies (the extras).
SERVER_PACKAGES = {
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "psycopg-binary",
    "boto3",
    "botocore",
    "celery",
    "kombu",
    "onnx",
    "onnxruntime",
    "numpy",
    "matplotlib",
    "cuda-bindings",
    "tensorrt-rtx",
    "onnxslim",
    "tenacity",
    "python-multipart",
    "redis",
    "filelock",
}


def run(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kw)


@pytest.mark.parametrize("version", ["3.11", "3.10"])
def test_base_install_is_the_client_only(tmp_path, client_wheel, version):
    venv = tmp_path / "venv"
    assert run(python(version), "-m", "venv", venv).returncode == 0
    py = venv / "bin" / "python"
    installed = run(py, "-m", "pip", "install", "-q", client_wheel)
    assert installed.returncode == 0, installed.stderr[-3000:]
    listed = json.loads(run(py, "-m", "pip", "list", "--format", "json").stdout)
    names = {p["name"].lower() for p in listed} - {"pip", "setuptools", "wheel"}
    assert not names & SERVER_PACKAGES, sorted(names & SERVER_PACKAGES)
    site = Path(run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    # A folder's path is its import name: the farm's layers install under their own names beside enginefarm/,
    # which holds the kernel, the graph and the client.
    assert [d for d in ("api", "worker", "storage", "server") if (site / d / "__init__.py").exists()] == [
        "api",
        "worker",
        "storage",
        "server",
    ]
    assert sorted(p.name for p in (site / "enginefarm").iterdir() if p.is_dir() and p.name != "__pycache__") == [
        "client",
        "core",
        "graph",
        "measure",
    ]

    fetch = run(venv / "bin" / "enginefarm", "fetch", "--help")
    assert fetch.returncode == 0 and "Fetch the engine" in fetch.stdout, fetch.stdout + fetch.stderr
    # The client, the probe and the offline resolver import and run without a server package.
    probe = run(
        py,
        "-c",
        "import sys; from enginefarm.core.probe.machineprobe import this_machine; from enginefarm.client import "
        "Client, resolve_offline; m = this_machine(); print(m.platform); "
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'api', 'worker', 'storage', 'server'}))",
    )
    assert probe.returncode == 0 and probe.stdout.strip(), probe.stderr[-2000:]
    assert probe.stdout.splitlines()[-1] == "[]", "the client imported a farm layer: " + probe.stdout
    # A farm command says which extra it needs, without a traceback.
    up = run(venv / "bin" / "enginefarm", "up")
    assert up.returncode == 2 and "pip install 'enginefarm[" in up.stderr and "Traceback" not in up.stderr, up.stderr

    size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) - sum(
        f.stat().st_size for d in ("pip", "setuptools") for f in site.glob(f"{d}/**/*") if f.is_file()
    )
    print(
        f"base install on Python {version}: {len(names)} packages, {size / 1e6:.1f} MB in site-packages "
        f"(pip and setuptools not counted): {', '.join(sorted(names))}"
    )
