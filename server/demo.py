"""``enginefarm demo``: the whole product on one machine, with no external services."""

from __future__ import annotations

import hashlib
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from enginefarm.client import Client
from enginefarm.client.cache import EngineCache
from enginefarm.client.report import plot_report, report_table
from enginefarm.client.tritonexport import export_from_farm
from enginefarm.core.config import Settings
from enginefarm.core.errors import NoCompatibleEngine
from enginefarm.core.machine import Machine
from enginefarm.core.probe.machineprobe import normalize_platform
from enginefarm.core.probe.modules import probe_modules
from enginefarm.graph.samples import sample_spec, save_conv_net
from server.embedded import Farm, embedded_env, issue_token

RTX_TARGETS = ["tensorrt-rtx/sm80", "tensorrt-rtx/sm86", "tensorrt-rtx/sm89", "tensorrt-rtx/sm120"]


def run_demo(data_dir: Path | None, console: Console, token: str | None = None, port: int | None = None) -> int:
    """Build, check, resolve and export a small model on an embedded farm, then stop it; 0 if every step gave what
    it should. ``token``: the admin token to use (``demo --serve`` prints it with the dashboard's address at the
    end); by default one is made and printed here. ``port``: the API's (default: a free one)."""
    import platform

    from enginefarm.client.lscli import engines_table
    from enginefarm.client.terminal import print_tasks

    data_dir = Path(data_dir or tempfile.mkdtemp(prefix="enginefarm-demo-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    arch = normalize_platform(platform.machine())
    rtx_version = probe_modules()[0].get("tensorrt_rtx")
    targets = (RTX_TARGETS if rtx_version else []) + [f"onnxruntime/cpu-{arch}"]
    console.rule("enginefarm demo")
    console.print(f"data: {data_dir} (SQLite catalog, local blob directory, database broker)", soft_wrap=True)
    if not rtx_version:
        console.print(
            "[yellow]TensorRT-RTX is not installed here, so this demo builds no GPU engine: it builds, "
            "benchmarks and resolves the ONNX Runtime CPU engine only. For the GPU targets: "
            "pip install 'enginefarm\\[rtx]'[/yellow]"
        )
    show_token = token is None
    token = token or issue_token(Settings(data_dir=data_dir, blob_store="local"), "demo", ["admin"])
    with Farm(embedded_env(data_dir), port=port, log_dir=data_dir, token=token) as farm:
        started = time.monotonic()
        farm.start_api()
        farm.start_worker("demo", concurrency=2)
        farm.wait_workers(["demo"])
        console.print(
            f"farm up at {farm.url} in {time.monotonic() - started:.1f} s: API + 1 Celery worker (2 processes)"
        )
        if show_token:
            console.print(f"an admin API token for this farm (writes need one): {token}", highlight=False)
        with Client(farm.url, token=token) as c:
            model_path = save_conv_net(data_dir / "inputs" / "convnet.onnx", channels=32, blocks=3)
            model, _ = c.upload(model_path, "convnet")
            console.print(
                f"1. uploaded {model_path.name}: model {model['id']}, sha256 {model['sha256'][:12]}, "
                "inputs " + ", ".join(f"{i['name']} {'x'.join(map(str, i['dims']))}" for i in model["inputs"])
            )
            # Benchmarked with trtexec's defaults at batch 1, 4 and 8 (the profile allows 1..8).
            build: dict[str, Any] = c.build(
                model["id"], targets, {**sample_spec(), "benchmark": {"batch_sizes": [1, 4, 8]}}
            )
            console.print(f"2. build {build['id']}: {', '.join(targets)}")
            build = c.wait_build(build["id"], timeout=600)
            print_tasks(build)
            if any(t["state"] != "succeeded" for t in build["tasks"]):
                console.print(f"[red]some targets failed; worker log: {data_dir / 'worker-demo.log'}[/red]")
                return 1
            console.print("3. the catalog:")
            console.print(engines_table(c.engines(model="convnet")["items"], "engines of convnet"))
            machine = Machine(
                gpu_name="NVIDIA GeForce RTX 3090",
                compute_capability="8.6",
                platform=arch,
                trt_rtx_version=rtx_version,
                driver_version="580.65",
                memory_mib=24576,
            )
            dest = data_dir / "fetched" / ("convnet-sm86.plan" if rtx_version else "convnet-cpu.onnx")
            cache = EngineCache(data_dir / "client-cache")
            answer = c.fetch("convnet", dest, machine, cache=cache).answer
            local_sha = hashlib.sha256(dest.read_bytes()).hexdigest()
            ok = local_sha == answer["engine"]["sha256"]
            console.print(
                f"4. resolve for an sm86 machine ({machine.gpu_name}, TensorRT-RTX {rtx_version or 'absent'}): "
                f"engine {answer['engine']['id']} ({answer['engine']['target']}): {answer['reason']}"
            )
            console.print(
                f"   downloaded {dest} ({dest.stat().st_size} bytes); sha256 {local_sha[:16]} "
                + ("[green]matches the catalog[/green]" if ok else "[red]DOES NOT MATCH[/red]")
            )
            again = c.fetch("convnet", dest, machine, cache=cache)
            console.print(
                f"   fetched again: {'from the local cache, no download' if again.from_cache else 'downloaded'}"
            )
            hopper = replace(machine, gpu_name="NVIDIA H100 80GB HBM3", compute_capability="9.0", memory_mib=81559)
            try:
                c.resolve("convnet", hopper)
            except NoCompatibleEngine as exc:  # no TensorRT-RTX engine runs on sm90, and the CPU file was not asked for
                console.print(
                    f"5. resolve for an H100 (sm90, which TensorRT-RTX does not support): 404, {exc.message}",
                    highlight=False,
                )
            h = c.resolve("convnet", hopper, explain=True, accept=["cpu"])
            console.print(f"   with accept=cpu (fetch --allow-cpu): {h['engine']['target']} ({h['match']}); excluded:")
            for r in h["rejected"]:
                console.print(f"   - {r['target']} (rule {r['rule']}): {r['reason']}", highlight=False)
            repo = export_from_farm(c, "convnet", data_dir / "triton", cache)
            console.print(
                f"6. Triton repository at {repo.root}: {', '.join(repo.models)} "
                f"({sum(f.name.endswith('.plan') for f in repo.files)} plans mapped by cc_model_filenames)"
            )
            for w in repo.warnings:
                console.print(f"   note: {w}", highlight=False)
            report = c.wait_checks(model["id"], timeout=300)
            console.print("7. benchmark and accuracy (trtexec's defaults; GPU engines wait for a GPU worker):")
            console.print(report_table(report))
            plot = plot_report(report, data_dir / "latency.png")
            console.print(f"   plot: {plot}")
            measured = [r for r in report["rows"] if r["status"] == "measured" and (r["accuracy"] or {}).get("pass")]
            return 0 if ok and again.from_cache and h["match"] == "cpu_fallback" and measured else 1
