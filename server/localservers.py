"""Local stand-ins for the distributed mode's servers: a SeaweedFS S3 server and a scratch
PostgreSQL database. Used by the test suite and the benchmarks; handy for trying the
distributed mode on one machine."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3

from server.embedded import Farm
from server.starterrors import StartFailed, exit_reason, log_excerpt

S3_KEY, S3_SECRET = "enginefarm-local", "enginefarm-local-secret"
PG_ADMIN = "host=127.0.0.1 user=postgres dbname=postgres"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_port_pair() -> int:
    """A free port p whose gRPC twin p+10000 (SeaweedFS's convention) is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 55000 and not port_open(port + 10000):
            return port
    raise RuntimeError("no free port pair")


@contextmanager
def seaweedfs(data_dir: Path, timeout: float = 90.0) -> Iterator[str]:
    """Run ``weed server`` with S3 on free ports; yields the S3 endpoint URL."""
    weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    data_dir.mkdir(parents=True, exist_ok=True)
    s3, master, volume, filer = (free_port_pair() for _ in range(4))
    log = open(data_dir / "weed.log", "wb")  # noqa: SIM115 - the server's log, closed when it stops
    proc = subprocess.Popen(
        [
            weed,
            "server",
            f"-dir={data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-s3",
            f"-s3.port={s3}",
            f"-master.port={master}",
            f"-volume.port={volume}",
            f"-filer.port={filer}",
            # No Iceberg/Lance side servers: their fixed default ports would clash between instances.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=200",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{s3}"
    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=S3_KEY, aws_secret_access_key=S3_SECRET, region_name="us-east-1"
    )
    deadline = time.monotonic() + timeout
    what = f"SeaweedFS (weed server, S3 on port {s3})"
    try:
        while True:
            if proc.poll() is not None:
                raise StartFailed(what, exit_reason(proc.returncode), Path(log.name), log_excerpt(Path(log.name)))
            try:
                client.list_buckets()
                break
            except Exception as exc:
                if time.monotonic() > deadline:
                    how = f"did not answer S3 at {endpoint} within {timeout:g} s ({exc})"
                    raise StartFailed(what, how, Path(log.name), log_excerpt(Path(log.name))) from exc
                time.sleep(0.5)
        yield endpoint
    finally:
        # weed does not exit at once on SIGTERM; give it time before SIGKILL.
        Farm.stop_process(proc, timeout=15)
        log.close()


@contextmanager
def scratch_postgres(prefix: str = "enginefarm_scratch") -> Iterator[str]:
    """A new PostgreSQL database on 127.0.0.1, dropped afterwards; yields its SQLAlchemy URL."""
    import psycopg

    db = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
    finally:
        from storage.db import _engine_for

        _engine_for.cache_clear()
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def distributed_env(data_dir: Path, database_url: str, broker_url: str, s3_endpoint: str) -> dict[str, str]:
    """ENGINEFARM_* settings for the distributed mode on these servers."""
    return {
        "ENGINEFARM_DATA_DIR": str(data_dir),
        "ENGINEFARM_DATABASE_URL": database_url,
        "ENGINEFARM_BROKER_URL": broker_url,
        "ENGINEFARM_BLOB_STORE": "s3",
        "ENGINEFARM_S3_ENDPOINT_URL": s3_endpoint,
        "ENGINEFARM_S3_BUCKET": f"enginefarm-{uuid.uuid4().hex[:8]}",
        "ENGINEFARM_S3_ACCESS_KEY": S3_KEY,
        "ENGINEFARM_S3_SECRET_KEY": S3_SECRET,
    }
