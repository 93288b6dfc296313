"""Resolve's tail on the embedded farm (`enginefarm up`: SQLite, API and workers), against /healthz in the same run.

A C load generator (wrk, Debian's package, installed by deploy/wrk.sh when missing; a Python generator on a small
machine measures itself) sends two paced streams at once, each about --rate requests/s over --connections
connections: GET /healthz (the floor) and the same GET /v1/resolve over and over (a fleet asking about the model
it runs: the fleet's path, a cached answer). Two pacings:

  lockstep   every connection waits 1/(rate/connections) s after each answer: the connections fire in bursts
  spread     each wait is random, uniform on [0, 2/(rate/connections)] s (same mean): arrivals spread out

and for each, both streams' p50 and p99 and the ratio resolve p99 / healthz p99. Then each stream alone in a
closed loop (no pacing): requests/s of resolve against /healthz's.

    python bench/tail.py                  # 20 s per pacing, ~300 req/s per stream over 64 connections
    python bench/tail.py --smoke          # 2 s: checks that it runs
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from enginefarm.core.config import Settings  # noqa: E402
from server.embedded import free_port, issue_token  # noqa: E402

MACHINE = {"cc": "8.6", "trt_rtx": "1.7.1.116", "platform": "x86_64", "accept": "cpu"}
ARCHES = ("sm75", "sm80", "sm86", "sm89", "sm120", "cpu")
LUA = {
    "lockstep": "function delay() return {wait} end\n",
    "spread": "math.randomseed(os.time() + math.floor(os.clock() * 1e6))\n"
    "function delay() return math.random(0, {twice}) end\n",
}


def fill(settings: Settings, models: int) -> None:
    """``models`` models of one version, each with an engine per architecture, written as the workers write them."""
    from storage.db import session_scope
    from storage.tables import EngineRow, ModelRow

    with session_scope(settings) as s:
        for i in range(models):
            sha = uuid.uuid4().hex * 2
            model = ModelRow(
                name=f"m{i}",
                version="1",
                seq=1,
                sha256=sha,
                format="onnx",
                blob_key=f"models/{sha}",
                size=1,
                info={"inputs": [], "outputs": [], "opset": 17, "ir_version": 8, "producer": "b"},
            )
            s.add(model)
            s.flush()
            for arch in ARCHES:
                cpu = arch == "cpu"
                cc = None if cpu else f"{arch[2:-1]}.{arch[-1]}"
                s.add(
                    EngineRow(
                        model_id=model.id,
                        model_sha256=sha,
                        spec_hash="0" * 64,
                        target="onnxruntime/cpu-x86_64" if cpu else f"tensorrt-rtx/{arch}",
                        backend="onnxruntime" if cpu else "tensorrt-rtx",
                        backend_version="1.23.2" if cpu else MACHINE["trt_rtx"],
                        precision="fp16",
                        compute_capability=cc,
                        compute_capabilities=[cc] if cc else [],
                        platform="x86_64",
                        trt_version=None if cpu else MACHINE["trt_rtx"],
                        sha256=uuid.uuid4().hex * 2,
                        size=1,
                        blob_key=f"engines/{uuid.uuid4().hex}",
                        build_seconds=0.1,
                    )
                )


def wrk(url: str, seconds: float, connections: int, script: Path | None, headers: dict[str, str]) -> subprocess.Popen:
    """wrk against ``url``: paced by ``script``'s delay, or a closed loop (each connection sends again at once)."""
    args = ["wrk", "-t2", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency"]
    args += ["-s", str(script)] if script else []
    for k, v in headers.items():
        args += ["-H", f"{k}: {v}"]
    return subprocess.Popen(args + [url], stdout=subprocess.PIPE, text=True)


def parse(out: str) -> dict:
    def ms(label: str) -> float:
        m = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            raise RuntimeError(f"wrk printed no {label}th percentile:\n{out}")
        return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    return {
        "p50_ms": ms("50"),
        "p99_ms": ms("99"),
        "rps": rps,
        "non2xx": int(bad.group(1)) if bad else 0,
        "socket_errors": errors.group(0) if errors else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rate", type=float, default=300, help="requests/s of each stream")
    parser.add_argument("--connections", type=int, default=64, help="connections of each stream")
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="2 s per pacing, 8 connections, 50 req/s")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seconds, args.rate, args.connections, args.models = 2, 50, 8, 2
    if shutil.which("wrk") is None:  # Debian's package, as deploy/services.sh installs the services
        subprocess.run(["bash", str(ROOT / "deploy" / "wrk.sh")], check=True)
    wait_ms = round(args.connections * 1000 / args.rate)
    with tempfile.TemporaryDirectory(prefix="tail-") as work:
        data = Path(work) / "farm"
        env = {**os.environ, "ENGINEFARM_DATA_DIR": str(data)}
        subprocess.run([sys.executable, "-m", "enginefarm", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
        settings = Settings(data_dir=data)
        fill(settings, args.models)
        token = issue_token(settings, "tail", ["read"])
        port = free_port()
        up = [sys.executable, "-m", "enginefarm", "up", "--port", str(port), "--data-dir", str(data)]
        farm = subprocess.Popen(
            up,
            env=env,
            stdout=open(Path(work) / "farm.log", "wb"),  # noqa: SIM115 - the farm's log, open while it runs
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            auth = {"Authorization": f"Bearer {token}"}
            resolve = f"{base}/v1/resolve?model=m1&" + "&".join(f"{k}={v}" for k, v in MACHINE.items())
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or farm.poll() is not None:
                    raise RuntimeError(f"the embedded farm did not start: see {work}/farm.log")
                time.sleep(0.5)
            first = httpx.get(resolve, headers=auth, timeout=30)
            assert first.status_code == 200, first.text[:300]
            print(
                f"embedded farm, {args.models} models x {len(ARCHES)} engines; each stream ~{args.rate:.0f} req/s "
                f"over {args.connections} connections, {args.seconds:.0f} s; {os.cpu_count()} CPUs; "
                f"load average before: {os.getloadavg()[0]:.2f}",
                flush=True,
            )
            ok = True
            for pacing, lua in LUA.items():
                script = Path(work) / f"{pacing}.lua"
                script.write_text(lua.format(wait=wait_ms, twice=2 * wait_ms))
                h = wrk(base + "/healthz", args.seconds, args.connections, script, {})
                r = wrk(resolve, args.seconds, args.connections, script, auth)
                hs, rs = parse(h.communicate()[0]), parse(r.communicate()[0])
                ok = ok and hs["non2xx"] == 0 and rs["non2xx"] == 0
                print(
                    f"{pacing:9s} healthz p50 {hs['p50_ms']:6.2f} p99 {hs['p99_ms']:7.2f} ms {hs['rps']:6.0f} req/s "
                    f"| "
                    f"resolve p50 {rs['p50_ms']:6.2f} p99 {rs['p99_ms']:7.2f} ms {rs['rps']:6.0f} req/s "
                    f"non-2xx {rs['non2xx']} | resolve/healthz p99 {rs['p99_ms'] / hs['p99_ms']:5.2f} "
                    f"(load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
            # Closed loop, one stream at a time (each connection sends again as soon as it is answered): how many
            # answers a second the embedded farm gives, against /healthz's in the same run.
            closed = {}
            for name, url, headers in (("healthz", base + "/healthz", {}), ("resolve", resolve, auth)):
                closed[name] = parse(wrk(url, args.seconds, args.connections, None, headers).communicate()[0])
                ok = ok and closed[name]["non2xx"] == 0
            hs, rs = closed["healthz"], closed["resolve"]
            print(
                f"closed    healthz {hs['rps']:6.0f} req/s p99 {hs['p99_ms']:7.2f} ms | resolve {rs['rps']:6.0f} req/s "
                f"p99 {rs['p99_ms']:7.2f} ms | resolve/healthz throughput {rs['rps'] / hs['rps']:5.2f} "
                f"(load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
        finally:
            os.killpg(farm.pid, signal.SIGTERM)
            try:
                farm.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(farm.pid, signal.SIGKILL)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
