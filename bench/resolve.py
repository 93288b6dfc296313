"""Resolution benchmark: what does judging and ranking every engine cost over reading them?

A PostgreSQL catalog is filled with one model of V versions, each with E engines (TensorRT-RTX for
every compute capability and spec, full TensorRT engines of several versions, CPU artifacts) and a
benchmark row per GPU engine. Through the real FastAPI app (in process, httpx transport), it times

  base     GET /v1/engines?model=M&limit=500: reading and serialising the same rows;
  resolve  POST /v1/resolve for an RTX 3090 machine: the same rows plus evidence, every rule, ranking;
  explain  the same with explain=true (every check of every candidate in the answer);

and prints the medians and the ratios resolve/base and explain/base. ``compat.choose`` alone is
timed too, per 1000 candidates.

    python bench/resolve.py                      # 200 and 500 engines, 30 requests each
    python bench/resolve.py --sizes 100 --requests 50
    python bench/resolve.py --smoke              # 20 engines, 3 requests: checks that it runs
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from api.app import create_app  # noqa: E402
from enginefarm.core.choose import Option, choose  # noqa: E402
from enginefarm.core.config import Settings  # noqa: E402
from enginefarm.core.machine import Machine  # noqa: E402
from server import localservers  # noqa: E402
from server.embedded import issue_token  # noqa: E402
from storage.db import session_scope  # noqa: E402
from storage.resolution import descriptor_of  # noqa: E402
from storage.tables import BenchmarkRow, EngineRow, ModelRow, VerdictRow  # noqa: E402

RTX = "1.7.1.116"
MACHINE = Machine(
    gpu_name="NVIDIA GeForce RTX 3090",
    compute_capability="8.6",
    memory_mib=24576,
    driver_version="580.82.07",
    cuda_version="13.0",
    trt_rtx_version=RTX,
    platform="x86_64",
)
ARCHES = ["sm75", "sm80", "sm86", "sm89", "sm120"]


def fill(settings: Settings, name: str, engines: int) -> None:
    """One model, versions of 50 engines each; a benchmark per GPU engine."""
    versions = max(1, engines // 50)
    with session_scope(settings) as s:
        for v in range(1, versions + 1):
            sha = f"{engines:032x}{v:032x}"
            model = ModelRow(
                name=name,
                version=str(v),
                seq=v,
                sha256=sha,
                format="onnx",
                blob_key=f"models/{sha}",
                size=1,
                info={"inputs": [], "outputs": [], "opset": 17, "ir_version": 8, "producer": "x"},
            )
            s.add(model)
            s.flush()
            for i in range(engines // versions):
                kind = i % 10
                arch = ARCHES[i % len(ARCHES)]
                cc = f"{arch[2:-1]}.{arch[-1]}"
                if kind < 6:
                    backend, version, trt, target = "tensorrt-rtx", RTX, RTX, f"tensorrt-rtx/{arch}"
                elif kind < 9:
                    version = ["10.3.0.26", "10.13.3.9", "10.14.1.48"][kind - 6]
                    backend, trt, target = "tensorrt", version, f"tensorrt/{arch}"
                else:
                    backend, version, trt, target, cc = "onnxruntime", "1.23.2", None, "onnxruntime/cpu-x86_64", None
                spec = f"{i:064x}"
                row = EngineRow(
                    model_id=model.id,
                    model_sha256=sha,
                    spec_hash=spec,
                    target=target,
                    backend=backend,
                    backend_version=version,
                    precision="fp16",
                    compute_capability=cc,
                    compute_capabilities=[cc] if cc else [],
                    gpu_name=None,
                    platform="x86_64",
                    trt_version=trt,
                    cuda_version="13.0",
                    driver_version="580.82.07",
                    hardware_compat="ampere_plus" if kind == 7 else "none",
                    version_compatible=kind == 8,
                    sha256=f"{engines:016x}{v:016x}{i:032x}",
                    size=40 << 20,
                    blob_key=f"engines/{engines}-{v}-{i}",
                    build_seconds=0.2,
                    built_by="bench",
                )
                s.add(row)
                s.flush()
                if i % 3 == 0:
                    s.add(VerdictRow(engine_id=row.id, project="", accuracy={"pass": True}, accuracy_pass=True))
                if cc:
                    s.add(
                        BenchmarkRow(
                            engine_id=row.id,
                            shape_key="opt",
                            gpu_name=MACHINE.gpu_name,
                            compute_capability=cc,
                            median_ms=1 + (i % 7) / 10,
                            machine={},
                            stats={},
                            shapes={},
                        )
                    )


def timed(fn, n: int) -> list[float]:
    fn()  # warm
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 500])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="20 engines, 3 requests: checks that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.requests = [20], 3
    console = Console(width=160)
    console.print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    table = Table(title="resolution vs reading the same engines (median ms)")
    for col in ("engines", "base: list", "resolve", "explain", "resolve/base", "explain/base", "choose per 1000"):
        table.add_column(col, justify="right")
    with localservers.scratch_postgres("enginefarm_bench") as url, tempfile.TemporaryDirectory() as data:
        settings = Settings(data_dir=Path(data), database_url=url)
        token = issue_token(settings, "bench-resolve", ["read"])
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {token}"}) as http:
            for size in args.sizes:
                name = f"bench-{size}"
                fill(settings, name, size)
                listed = http.get("/v1/engines", params={"model": name, "limit": 500}).json()
                assert listed["total"] == size, listed["total"]
                body = {"model": name, "machine": asdict(MACHINE)}
                answer = http.post("/v1/resolve", json=body).json()
                assert answer["engine"]["compute_capability"] == "8.6", answer
                base = statistics.median(
                    timed(
                        lambda: http.get("/v1/engines", params={"model": name, "limit": 500}),  # noqa: B023 - called in this iteration
                        args.requests,
                    )
                )
                res = statistics.median(timed(lambda: http.post("/v1/resolve", json=body), args.requests))  # noqa: B023 - called in this iteration
                exp = statistics.median(
                    timed(
                        lambda: http.post("/v1/resolve", json=body | {"explain": True}),  # noqa: B023 - called in this iteration
                        args.requests,
                    )
                )
                with session_scope(settings) as s:
                    options = [Option(r.id, descriptor_of(r), 1) for r in s.query(EngineRow).limit(1000)]
                per = statistics.median(timed(lambda: choose(options, MACHINE), 20)) * 1000 / len(options)  # noqa: B023 - called in this iteration
                table.add_row(
                    str(size),
                    f"{base * 1e3:.1f}",
                    f"{res * 1e3:.1f}",
                    f"{exp * 1e3:.1f}",
                    f"{res / base:.2f}",
                    f"{exp / base:.2f}",
                    f"{per * 1e3:.1f}",
                )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
