"""Fill a migrated PostgreSQL catalog with a fleet-sized zoo of engines, by COPY.

``models`` models of one version each, ``engines`` engines per model spread as a real farm's are: TensorRT-RTX
for every compute capability it builds (two runtime versions), full TensorRT for the datacenter and Jetson
GPUs (three versions, JetPack's on aarch64), CPU artifacts for x86_64 and aarch64; fp16, fp32, int8 and bf16;
about a third benchmarked on the GPU model it was built for. 1,000,000 engines take a few minutes.
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RTX_VERSIONS = ["1.7.1.116", "1.6.0.41"]
RTX_ARCHES = ["sm75", "sm80", "sm86", "sm89", "sm90", "sm100", "sm120"]
TRT = [("10.14.1.48", "x86_64"), ("10.13.3.9", "x86_64"), ("10.3.0.30", "aarch64")]
TRT_ARCHES = {"x86_64": ["sm80", "sm86", "sm89", "sm90"], "aarch64": ["sm87"]}
GPU_OF = {
    "sm75": "Tesla T4",
    "sm80": "NVIDIA A100-SXM4-80GB",
    "sm86": "NVIDIA GeForce RTX 3090",
    "sm87": "Orin",
    "sm89": "NVIDIA L4",
    "sm90": "NVIDIA H100 80GB HBM3",
    "sm100": "NVIDIA B200",
    "sm120": "NVIDIA GeForce RTX 5090",
}
PRECISIONS = ["fp16", "fp16", "fp32", "int8", "bf16"]

ENGINE_COLS = (
    "id",
    "model_id",
    "model_sha256",
    "spec_hash",
    "target",
    "backend",
    "backend_version",
    "precision",
    "compute_capability",
    "compute_capabilities",
    "gpu_name",
    "platform",
    "trt_version",
    "cuda_version",
    "driver_version",
    "hardware_compat",
    "version_compatible",
    "sha256",
    "size",
    "blob_key",
    "build_seconds",
    "built_by",
    "created_at",
    "profiles",
    "kind_key",
)
VERDICT_COLS = ("engine_id", "project", "accuracy", "accuracy_pass", "checked_at")
MODEL_COLS = (
    "id",
    "project",
    "name",
    "version",
    "seq",
    "sha256",
    "format",
    "blob_key",
    "size",
    "info",
    "created_at",
    "generation",
)
BENCH_COLS = (
    "engine_id",
    "shape_key",
    "shapes",
    "gpu_name",
    "compute_capability",
    "machine",
    "median_ms",
    "p99_ms",
    "throughput_qps",
    "stats",
    "created_at",
)
INFO = json.dumps(
    {
        "inputs": [{"name": "images", "dtype": "float32", "dims": ["batch", 3, 640, 640]}],
        "outputs": [{"name": "output0", "dtype": "float32", "dims": ["batch", 84, 8400]}],
        "opset": 17,
        "ir_version": 8,
        "producer": "pytorch",
    }
)


def kinds() -> list[tuple]:
    """Every (target, backend, backend version, trt version, platform, cc) a farm builds."""
    out = []
    for arch in RTX_ARCHES:
        for v in RTX_VERSIONS:
            out.append((f"tensorrt-rtx/{arch}", "tensorrt-rtx", v, v, "x86_64", f"{arch[2:-1]}.{arch[-1]}"))
    for v, plat in TRT:
        for arch in TRT_ARCHES[plat]:
            out.append((f"tensorrt/{arch}", "tensorrt", v, v, plat, f"{arch[2:-1]}.{arch[-1]}"))
    for plat in ("x86_64", "aarch64"):
        out.append((f"onnxruntime/cpu-{plat}", "onnxruntime", "1.23.2", None, plat, None))
    return out


def accuracy(rng: random.Random, cc: str | None) -> bool | None:
    """Most engines passed their accuracy check, some were never checked, a few failed; CPU artifacts passed."""
    if cc is None:
        return True
    x = rng.random()
    return False if x < 0.02 else None if x < 0.3 else True


def model_name(i: int) -> str:
    return f"fleet-{i:05d}"


@functools.cache
def kind_key_of(target, backend, version, precision, trt, plat, cc) -> int:
    """The kind key the farm writes with an engine of these facts (``compat.kind_key``)."""
    from enginefarm.core.compat import kind_key

    return kind_key(
        {
            "target": target,
            "backend": backend,
            "backend_version": version,
            "precision": precision,
            "platform": plat,
            "compute_capability": cc,
            "compute_capabilities": [cc] if cc else [],
            "trt_version": trt,
            "cuda_version": "13.0" if cc else None,
            "driver_version": "580.82.07" if cc else None,
        }
    )


def fill(pg_url: str, models: int, engines: int, seed: int = 7) -> dict:
    """COPY the zoo into the catalog at ``pg_url`` (migrated, empty); returns counts and seconds."""
    import psycopg

    rng = random.Random(seed)
    all_kinds = kinds()
    started = time.perf_counter()
    now = "2026-11-01 00:00:00+00"
    benchmarks = 0
    with psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        with conn.cursor() as cur:
            with cur.copy(f"COPY models ({', '.join(MODEL_COLS)}) FROM STDIN") as copy:
                for m in range(1, models + 1):
                    copy.write_row(
                        (m, "", model_name(m), "1", 1, f"{m:064x}", "onnx", f"models/{m:064x}", 1 << 20, INFO, now, 0)
                    )
            eid = 0
            verdicts = []
            with cur.copy(f"COPY engines ({', '.join(ENGINE_COLS)}) FROM STDIN") as copy:
                for m in range(1, models + 1):
                    for i in range(engines):
                        eid += 1
                        target, backend, version, trt, plat, cc = all_kinds[i % len(all_kinds)]
                        precision = PRECISIONS[(i // len(all_kinds)) % len(PRECISIONS)]
                        batch_max = rng.choice([1, 8, 16, 32])
                        profile = {
                            "images": {
                                "min": [1, 3, 640, 640],
                                "opt": [max(1, batch_max // 2), 3, 640, 640],
                                "max": [batch_max, 3, 640, 640],
                            }
                        }
                        copy.write_row(
                            (
                                eid,
                                m,
                                f"{m:064x}",
                                f"{i // len(all_kinds):064x}",
                                target,
                                backend,
                                version,
                                precision,
                                cc,
                                json.dumps([cc] if cc else []),
                                None,
                                plat,
                                trt,
                                "13.0" if cc else None,
                                "580.82.07" if cc else None,
                                "none",
                                False,
                                f"{eid:064x}",
                                40 << 20,
                                f"engines/{eid:064x}",
                                30.0,
                                "fill",
                                now,
                                json.dumps([profile]),
                                kind_key_of(target, backend, version, precision, trt, plat, cc),
                            )
                        )
                        if (passed := accuracy(rng, cc)) is not None:
                            verdicts.append((eid, "", json.dumps({"pass": passed}), passed, now))
            with cur.copy(f"COPY engine_verdicts ({', '.join(VERDICT_COLS)}) FROM STDIN") as copy:
                for row in verdicts:
                    copy.write_row(row)
            with cur.copy(f"COPY benchmarks ({', '.join(BENCH_COLS)}) FROM STDIN") as copy:
                eid = 0
                for _model in range(1, models + 1):
                    for i in range(engines):
                        eid += 1
                        target, _b, _v, _t, _p, cc = all_kinds[i % len(all_kinds)]
                        if cc and rng.random() < 0.33:
                            benchmarks += 1
                            median = round(rng.uniform(0.5, 20), 3)
                            copy.write_row(
                                (
                                    eid,
                                    "opt",
                                    "{}",
                                    GPU_OF[target.rsplit("/", 1)[1]],
                                    cc,
                                    "{}",
                                    median,
                                    median * 1.3,
                                    1000 / median,
                                    "{}",
                                    now,
                                )
                            )
            for table in ("models", "engines", "benchmarks", "engine_verdicts"):
                cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE models")
        conn.execute("VACUUM ANALYZE engines")
        conn.execute("VACUUM ANALYZE benchmarks")
        conn.execute("VACUUM ANALYZE engine_verdicts")
    return {
        "models": models,
        "engines": models * engines,
        "benchmarks": benchmarks,
        "seconds": time.perf_counter() - started,
    }


@contextmanager
def scratch_catalog(name: str, redis_db: int) -> Iterator[tuple[Path, str, dict[str, str]]]:
    """A scratch folder, a fresh PostgreSQL database ``name``, migrated, and the ENGINEFARM_* settings of a farm on
    them (Redis db ``redis_db``, no reconciler, no collector): yields the folder, the database's URL and the
    settings. PostgreSQL and Redis are started where they are not running."""
    from server import localservers

    if not (localservers.port_open(5432) and localservers.port_open(6379)):
        root = Path(__file__).resolve().parents[1]
        subprocess.run(["bash", str(root / "deploy" / "services.sh")], check=True)
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as folder, localservers.scratch_postgres(name) as pg_url:
        work = Path(folder)
        env = {
            "ENGINEFARM_DATA_DIR": str(work / "data"),
            "ENGINEFARM_DATABASE_URL": pg_url,
            "ENGINEFARM_BROKER_URL": f"redis://127.0.0.1:6379/{redis_db}",
            "ENGINEFARM_RECONCILE_SECONDS": "0",
            "ENGINEFARM_GC_INTERVAL_SECONDS": "0",
        }
        subprocess.run(
            [sys.executable, "-m", "enginefarm", "migrate"],
            env={k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")} | env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        yield work, pg_url, env
