"""``enginefarm demo --serve``: the demo, then its farm kept running for the dashboard.

The demo runs first; then its farm starts again on the demo's data folder on a fixed port, prints the dashboard's
address and the demo's admin token, and serves until Ctrl-C. A taken port is a line on stderr and exit code 2
before the demo starts.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from enginefarm.core.config import Settings
from server.demo import run_demo
from server.embedded import Farm, embedded_env, issue_token, stop_on_sigterm
from server.metricsdir import metrics_dir
from server.port import HOST, taken_message

DEFAULT_PORT = 8321


def port_refused(port: int) -> bool:
    """Whether ``port`` is taken; if it is, says so in one line on stderr."""
    message = taken_message(port, HOST)
    if message:
        Console(stderr=True).print(f"enginefarm demo: {message}", highlight=False, soft_wrap=True)
    return message is not None


def demo_token(data_dir: Path) -> str:
    """The demo's one admin token, made in its catalog."""
    return issue_token(Settings(data_dir=data_dir, blob_store="local"), "demo", ["admin"])


def serve_farm(data_dir: Path, console: Console, port: int = DEFAULT_PORT, ready=None, token: str | None = None) -> int:
    """Run the embedded farm of ``data_dir`` (API + one worker) until Ctrl-C or SIGTERM, printing the dashboard's
    address and ``token`` (default: a new admin token). ``ready(url, token)``: called once the farm is up (tests).
    Exit code 2 at once if ``port`` is taken."""
    if port_refused(port):
        return 2
    token = token or demo_token(data_dir)
    metrics_dir(data_dir / "metrics")  # one folder, as `enginefarm up` has: /metrics counts the worker's builds too
    farm = Farm(embedded_env(data_dir), port=port, log_dir=data_dir, token=token, stop_timeout=8)

    def announce() -> None:
        console.rule("the dashboard")
        console.print("open the dashboard and sign in with the token below; Ctrl-C stops the farm", highlight=False)
        print(f"ENGINEFARM_UI={farm.url}/ui", flush=True)
        console.print("the CLI, in another shell (the tour in the README):", highlight=False)
        print(cli_exports(farm.url, token, data_dir), flush=True)
        if ready is not None:
            ready(farm.url, token)

    farm.serve({"demo": 2}, announce)
    return 0


def cli_exports(url: str, token: str, data_dir: Path) -> str:
    """The lines that point a shell's ``enginefarm`` at this farm: this installation's folder on the PATH where
    the shell would not find it, the API's address, the token, and the data folder (what ``enginefarm token`` and
    ``gc`` read)."""
    here = Path(sys.executable).parent
    found = shutil.which("enginefarm")
    lines = [] if found and Path(found).parent == here else [f'export PATH="{here}:$PATH"']
    exports = {"ENGINEFARM_API_URL": url, "ENGINEFARM_TOKEN": token, "ENGINEFARM_DATA_DIR": str(data_dir)}
    return "\n".join([*lines, *(f"export {k}={shlex.quote(v)}" for k, v in exports.items())])


def serve_demo(data_dir: Path | None, console: Console, port: int = DEFAULT_PORT) -> int:
    """The demo, then its farm served (``serve_farm``) with the same token, on ``port`` from the start; the demo's
    exit code if it failed, 2 at once if ``port`` is taken. A data folder it made (no ``data_dir``) is removed
    when it ends."""
    if port_refused(port):
        return 2
    made = data_dir is None
    data_dir = Path(data_dir or tempfile.mkdtemp(prefix="enginefarm-demo-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    token = demo_token(data_dir)
    with stop_on_sigterm():
        code = run_demo(data_dir, console, token=token, port=port)
    if code != 0:  # its logs stay, to read
        return code
    code = serve_farm(data_dir, console, port, token=token)
    if made:
        shutil.rmtree(data_dir, ignore_errors=True)
        console.print(
            f"removed the demo's data ({data_dir}); --data-dir DIR (make demo DEMO_DATA_DIR=DIR) keeps it",
            highlight=False,
            soft_wrap=True,
        )
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.demoserve", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--skip-demo", action="store_true", help="serve the data folder of a demo that already ran")
    args = parser.parse_args(argv)
    console = Console()
    if args.skip_demo:
        if args.data_dir is None:
            parser.error("--skip-demo needs --data-dir")
        return serve_farm(args.data_dir, console, args.port)
    return serve_demo(args.data_dir, console, args.port)


if __name__ == "__main__":
    sys.exit(main())
