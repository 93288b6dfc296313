"""deploy/compose.yaml run for real under podman: the images built here (no registry is reachable, so the
third-party services run as local stand-ins from tests/deploy/*.Containerfile), the stack brought up, taken apart
again, and its containers reached with ``podman exec``."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
HERE = Path(__file__).resolve().parent
STANDINS = ("postgres", "redis", "seaweedfs")


def compose_command() -> list[str]:
    """podman-compose beside this Python (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "podman-compose"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("podman-compose")
    if not found:
        raise RuntimeError("podman-compose is not installed: pip install 'podman-compose>=1.6'")
    return [found]


def run(args: list[str], timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run a command; on failure raise with its output, which is what a failing test needs to show."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def prepare_machine() -> str:
    """deploy/podman.sh: podman installed and configured, the local base image made; returns the base's name."""
    return run(["bash", str(DEPLOY / "podman.sh")], timeout=900).stdout.strip().splitlines()[-1]


def build(
    containerfile: Path, tag: str, base: str, context: Path, ignorefile: Path | None = None, timeout: float = 1200
) -> float:
    """Build an image FROM ``base``; returns the seconds it took. Host networking: the build's apt-get and pip reach
    their servers however this machine's networking is set up."""
    args = [
        "podman",
        "build",
        "--format",
        "docker",
        "--network",
        "host",
        "--build-arg",
        f"BASE={base}",
        "-f",
        str(containerfile),
        "-t",
        tag,
    ]
    args += ["--ignorefile", str(ignorefile)] if ignorefile else []
    args.append(str(context))
    start = time.monotonic()
    try:
        run(args, timeout=timeout)
    except RuntimeError as exc:
        # An image removed by another podman command while this build looked up its cached layers; once more.
        if "layer not known" not in str(exc):
            raise
        run(args, timeout=timeout)
    return time.monotonic() - start


def image_size(tag: str) -> int:
    return int(run(["podman", "image", "inspect", "--format", "{{.Size}}", tag]).stdout.strip())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """One compose project of deploy/compose.yaml, named ``project``, with its settings in ``env_file``."""

    def __init__(self, project: str, env_file: Path, api_port: int):
        self.project = project
        self.env_file = env_file
        self.url = f"http://127.0.0.1:{api_port}"

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        return run(
            [
                *compose_command(),
                "-p",
                self.project,
                "-f",
                str(DEPLOY / "compose.yaml"),
                "--env-file",
                str(self.env_file),
                *args,
            ],
            timeout=timeout,
            check=check,
        )

    def container(self, service: str) -> str:
        names = run(
            [
                "podman",
                "ps",
                "-a",
                "--format",
                "{{.Names}}",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
                "--filter",
                f"label=com.docker.compose.service={service}",
            ]
        ).stdout.split()
        if len(names) != 1:
            raise RuntimeError(f"service {service} has containers {names}")
        return names[0]

    def exec(self, service: str, *args: str, timeout: float = 120) -> str:
        return run(["podman", "exec", self.container(service), *args], timeout=timeout).stdout.strip()

    def healthy(self, service: str) -> bool:
        """The image's own health check, run now (podman runs it on a timer only under systemd)."""
        return run(["podman", "healthcheck", "run", self.container(service)], check=False, timeout=60).returncode == 0

    def wait_healthy(self, services: list[str], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(services)
        while waiting:
            waiting = [s for s in waiting if not self.healthy(s)]
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(f"not healthy after {timeout} s: {waiting}\n{self.logs(*waiting)}")
            if waiting:
                time.sleep(1)

    def up(self, *services: str) -> None:
        """Start services by name. Each phase's dependencies are waited for by the caller: podman-compose hands
        depends_on to podman as --requires, and podman 4.3 cannot start a container whose requirement is a job that
        has exited (the migrations); nor does it run health checks without systemd."""
        self.compose("up", "-d", "--no-deps", *services)

    def wait_ready(self, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(f"{self.url}/readyz", timeout=10)
                if answer.status_code == 200:
                    return answer.json()
                last = answer.text
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(1)
        raise TimeoutError(f"{self.url}/readyz not ready after {timeout} s: {last}\n{self.logs('api', 'migrate')}")

    def logs(self, *services: str, tail: int = 60) -> str:
        out = []
        for service in services:
            try:
                proc = run(["podman", "logs", "--tail", str(tail), self.container(service)], check=False)
                out.append(f"--- {service}\n{proc.stdout}{proc.stderr}")
            except RuntimeError as exc:
                out.append(f"--- {service}: {exc}")
        return "\n".join(out)

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, volumes and networks of this project still present."""
        label = f"label=com.docker.compose.project={self.project}"
        return {
            "containers": run(["podman", "ps", "-a", "-q", "--filter", label]).stdout.split(),
            "volumes": run(["podman", "volume", "ls", "-q", "--filter", label]).stdout.split(),
            "networks": [
                n
                for n in run(["podman", "network", "ls", "--format", "{{.Name}}"]).stdout.split()
                if n.startswith(f"{self.project}_")
            ],
        }

    def down(self) -> dict[str, list[str]]:
        """Remove everything the project made, even what `down` missed; returns what was still there after `down`."""
        self.compose("down", "-v", "-t", "10", check=False, timeout=300)
        left = self.leftovers()
        for cid in left["containers"]:
            run(["podman", "rm", "-f", "-v", "-t", "5", cid], check=False)
        for vol in left["volumes"]:
            run(["podman", "volume", "rm", "-f", vol], check=False)
        for net in left["networks"]:
            run(["podman", "network", "rm", "-f", net], check=False)
        return left
