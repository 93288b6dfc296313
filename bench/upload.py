"""Upload speed: how fast a large bundle arrives in the farm, against ``cp`` of the same file, and how the API
answers ``/healthz`` meanwhile.

One run generates a bundle (a zip of model.onnx and a weights file of random bytes, stored uncompressed as
exporters' weights usually are), starts an embedded farm (SQLite, local blob store) whose data directory is on
the same disk, and measures

  cp        ``cp`` of the bundle to a new file in that directory (the baseline; also with its fsync, since an
            upload answers only once its bytes are on disk)
  floor     what any upload of it must do at least, with no HTTP and no Python per chunk: a socket's bytes
            read into one reused buffer, hashed (sha256), written, then fsynced while every stored entry's CRC
            is checked from the written file (mapped, not copied). One thread, as the farm's receiving thread is;
            the sender runs beside it. The upload cannot beat this on the same machine.
  server    the same POST to a bare app under the same server (bench/floorapp.py), which reads the body and
            drops it: what the HTTP server alone costs to receive the bytes, before any app does anything
  upload    POST /v1/models of the bundle, from the first byte sent until the 201: spooled, hashed, inspected
            and stored. The client sends with sendfile(2), so it takes almost no CPU from the API.
  healthz   sequential keep-alive GET /healthz, first with the farm idle, then while two uploads run at once

Each repeat measures the floor, the bare server and the upload of the same bundle back to back, each after a sync
(``--drop-caches``, as root: with the page cache emptied and the bundle read back in), each one's file removed as
soon as it is measured, so that the three meet the same page cache (whose state swings a write's cost by 2-3x from
minute to minute on some machines). It prints upload/floor per repeat and their median, and the other ratios.
Every upload sends bytes of its own (the zip comment differs), so none is a repeat the
farm recognises.

    python bench/upload.py                  # a 1600 MB bundle, 3 uploads (needs about 15 GB of free disk)
    python bench/upload.py --size-mb 400    # smaller
    python bench/upload.py --smoke          # a few MB: checks that it runs
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import mmap
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
import zlib
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

import numpy as np  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from bench import floorapp  # noqa: E402
from enginefarm.core.config import Settings  # noqa: E402
from server.embedded import Farm, embedded_env, issue_token  # noqa: E402
from storage.blobs import model_key  # noqa: E402
from storage.blobs.local import LocalBlobStore  # noqa: E402

BOUNDARY = "benchUpl0adB0undary"
MB = 1 << 20


# ------------------------------------------------------------------------------ the bundle


def model_bytes(floats: int) -> bytes:
    """y = x + W, with W (``floats`` float32) kept in weights.bin."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [floats])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [floats])
    w = TensorProto(name="W", dims=[floats], data_type=TensorProto.FLOAT, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(floats * 4))):
        w.external_data.add(key=key, value=value)
    graph = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"])], "bench_upload", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def make_bundle(path: Path, size_mb: int) -> None:
    """A zip of model.onnx and ``size_mb`` MB of random weights, written a chunk at a time."""
    floats = size_mb * MB // 4
    rng = np.random.default_rng(7)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("model.onnx", model_bytes(floats))
        with zf.open("weights.bin", "w", force_zip64=True) as out:
            left = floats * 4
            while left:
                step = min(left, 16 * MB)
                out.write(rng.bytes(step))
                left -= step


def recomment(path: Path, comment: bytes) -> None:
    """Give the bundle new bytes (and so a new sha256) without touching its entries."""
    with zipfile.ZipFile(path, "a") as zf:
        zf.comment = comment


# ------------------------------------------------------------------------------ the baseline


def timed_cp(src: Path, dest: Path) -> tuple[float, float]:
    """Seconds for ``cp src dest``, and for the fsync that then puts its bytes on disk."""
    started = time.perf_counter()
    subprocess.run(["cp", str(src), str(dest)], check=True)
    copied = time.perf_counter()
    fd = os.open(dest, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    synced = time.perf_counter()
    dest.unlink()
    return copied - started, synced - started


def check_stored_crcs(path: Path) -> int:
    """Check every entry's CRC-32 straight from the file's pages; returns the entries checked."""
    with zipfile.ZipFile(path) as zf, open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            for info in zf.infolist():
                head = info.header_offset
                name_len, extra_len = (
                    int.from_bytes(mm[head + 26 : head + 28], "little"),
                    int.from_bytes(mm[head + 28 : head + 30], "little"),
                )
                start = head + 30 + name_len + extra_len
                if zlib.crc32(view[start : start + info.compress_size]) != info.CRC:
                    raise RuntimeError(f"{info.filename}: CRC mismatch")
            return len(zf.infolist())
        finally:
            view.release()


def timed_floor(src: Path, dest: Path) -> float:
    """Seconds for the floor (module docstring): from the first byte sent until the receiver has the bytes
    hashed, on disk and their CRCs checked. ``dest`` is removed afterwards."""
    size = src.stat().st_size
    listener = socket.create_server(("127.0.0.1", 0))
    failed: list[BaseException] = []

    def receive() -> None:
        conn, _ = listener.accept()
        buf = memoryview(bytearray(1 << 20))
        digest = hashlib.sha256()
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            got = 0
            while got < size and (n := conn.recv_into(buf)):
                digest.update(buf[:n])
                done = 0
                while done < n:
                    done += os.write(fd, buf[done:n])
                got += n
            # The fsync and the CRC checks at once, as the farm overlaps its spool's fsync with the inspection.
            syncing = threading.Thread(target=os.fsync, args=(fd,), daemon=True)
            syncing.start()
            try:
                check_stored_crcs(dest)
            finally:
                syncing.join()  # before the descriptor is closed below
            conn.sendall(b"k")
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            failed.append(exc)
        finally:
            os.close(fd)
            conn.close()

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    with socket.create_connection(listener.getsockname()) as sock, open(src, "rb") as fh:
        started = time.perf_counter()
        sock.sendfile(fh)
        sock.recv(1)
        elapsed = time.perf_counter() - started
    receiver.join()
    listener.close()
    dest.unlink()
    if failed:
        raise failed[0]
    return elapsed


# ------------------------------------------------------------------------------ the farm's side


def upload(host: str, port: int, token: str, path: Path, name: str) -> tuple[float, float, str]:
    """POST the bundle as multipart (sendfile for the file part); returns (seconds until the last byte was sent,
    seconds until the answer, the stored model's sha256). Raises unless the farm answers 201."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\n\r\n{name}\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{path.name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()
    length = len(head) + path.stat().st_size + len(tail)
    request = (
        f"POST /v1/models HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {length}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((host, port), timeout=600) as sock, open(path, "rb") as fh:
        started = time.perf_counter()
        sock.sendall(request + head)
        sock.sendfile(fh)
        sock.sendall(tail)
        sent = time.perf_counter()
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        body = answer.read()
        done = time.perf_counter()
    if answer.status != 201:
        raise RuntimeError(f"upload of {path.name} answered {answer.status}: {body[:500]!r}")
    return sent - started, done - started, json.loads(body)["sha256"]


class HealthProbe(threading.Thread):
    """Sequential keep-alive GET /healthz until stopped; ``times`` in ms."""

    def __init__(self, host: str, port: int, pause_s: float = 0.005):
        super().__init__(daemon=True)
        self.host, self.port, self.pause_s = host, port, pause_s
        self.times: list[float] = []
        self.failures = 0
        self._done = threading.Event()

    def run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        while not self._done.is_set():
            started = time.perf_counter()
            try:
                conn.request("GET", "/healthz")
                answer = conn.getresponse()
                answer.read()
                ok = answer.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
            if ok:
                self.times.append((time.perf_counter() - started) * 1000)
            else:
                self.failures += 1
            self._done.wait(self.pause_s)
        conn.close()

    def stop(self) -> list[float]:
        self._done.set()
        self.join(60)
        return self.times


def percentiles(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


# ------------------------------------------------------------------------------ one run


def settle_cache(drop: bool, bundle: Path) -> None:
    """Before a measurement: every dirty page on disk; with ``drop`` (root only) the page cache emptied, then the
    bundle about to be sent read back into it (the sender reads from memory, as in every other measurement)."""
    os.sync()
    if drop:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        with open(bundle, "rb") as fh:
            while fh.read(16 * MB):
                pass


def run(args, work: Path) -> int:
    data = work / "farm-data"
    env = embedded_env(data)
    settings = Settings(data_dir=data, blob_store="local")
    token = issue_token(settings, "bench-upload", ["admin"])
    bundles = [work / "a.zip", work / "b.zip"]
    started = time.perf_counter()
    make_bundle(bundles[0], args.size_mb)
    shutil.copyfile(bundles[0], bundles[1])
    size = bundles[0].stat().st_size
    print(
        f"bundle: {size / MB:.0f} MB (model.onnx + weights.bin, stored), made in "
        f"{time.perf_counter() - started:.1f} s; work dir {work}"
    )

    settings.work_dir.mkdir(parents=True, exist_ok=True)
    cps = [timed_cp(bundles[0], settings.work_dir / "cp-baseline") for _ in range(args.repeat)]
    cp_s = statistics.median(c[0] for c in cps)
    cp_sync_s = statistics.median(c[1] for c in cps)

    farm = Farm(env, log_dir=work, token=token)
    with ExitStack() as stack:
        server_port = stack.enter_context(floorapp.served()).port
        stack.callback(farm.stop)
        farm.start_api(timeout=120)
        host, port = farm.host, farm.port
        tag = uuid.uuid4().hex[:8]
        runs, floors, servers = [], [], []
        store = LocalBlobStore(settings.resolved_blob_dir)
        for i in range(args.repeat):
            # The floor, the bare server and the upload of one bundle back to back, each after a sync (and with
            # --drop-caches an emptied page cache), each one's file removed as soon as it is measured: the three
            # meet the same page cache, which on its own swings a write's cost by 2-3x from minute to minute.
            bundle = bundles[i % 2]
            recomment(bundle, f"{tag}-{i}".encode())
            settle_cache(args.drop_caches, bundle)
            floors.append(timed_floor(bundle, settings.work_dir / "floor"))
            settle_cache(args.drop_caches, bundle)
            servers.append(upload("127.0.0.1", server_port, token, bundle, "bare")[1])
            settle_cache(args.drop_caches, bundle)
            runs.append(upload(host, port, token, bundle, f"bench-upload-{tag}-{i}"))
            store.delete(model_key(runs[-1][2]))  # the bench's own farm: its catalog row is thrown away with it
        floor_s, server_s = statistics.median(floors), statistics.median(servers)
        sent_s = statistics.median(r[0] for r in runs)
        up_s = statistics.median(r[1] for r in runs)
        pair_ratios = [f / r[1] for f, r in zip(floors, runs)]

        probe = HealthProbe(host, port)
        probe.start()
        time.sleep(args.idle_s)
        idle = probe.stop()

        for i, bundle in enumerate(bundles):
            recomment(bundle, f"{tag}-both-{i}".encode())
        results: list = [None, None]

        def one(i: int) -> None:
            try:
                results[i] = upload(host, port, token, bundles[i], f"bench-upload-{tag}-both-{i}")
            except BaseException as exc:  # noqa: BLE001 - reported below
                results[i] = exc

        probe = HealthProbe(host, port)
        probe.start()
        uploaders = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        both_started = time.perf_counter()
        for t in uploaders:
            t.start()
        for t in uploaders:
            t.join()
        both_s = time.perf_counter() - both_started
        busy = probe.stop()
        for r in results:
            if isinstance(r, BaseException):
                raise r

    up_mbs, cp_mbs, cp_sync_mbs = size / MB / up_s, size / MB / cp_s, size / MB / cp_sync_s
    floor_mbs = size / MB / floor_s
    idle_p50, idle_p99 = percentiles(idle)
    busy_p50, busy_p99 = percentiles(busy)
    print(f"\nthroughput, median of {args.repeat} ({size / MB:.0f} MB each):")
    print(f"  cp                      {cp_s:7.2f} s  {cp_mbs:8.0f} MB/s")
    print(f"  cp + fsync              {cp_sync_s:7.2f} s  {cp_sync_mbs:8.0f} MB/s")
    print(f"  floor                   {floor_s:7.2f} s  {floor_mbs:8.0f} MB/s   (hash, write, fsync, CRCs)")
    server_mbs = size / MB / server_s
    print(f"  server alone            {server_s:7.2f} s  {server_mbs:8.0f} MB/s   (a bare app: body read, dropped)")
    print(f"  upload (201 answered)   {up_s:7.2f} s  {up_mbs:8.0f} MB/s   (last byte sent after {sent_s:.2f} s)")
    print(f"  two uploads at once     {both_s:7.2f} s  {2 * size / MB / both_s:8.0f} MB/s together")
    print("GET /healthz (ms):            p50      p99   requests")
    print(f"  idle                    {idle_p50:7.1f}  {idle_p99:7.1f}   {len(idle):6d}")
    print(
        f"  during two uploads      {busy_p50:7.1f}  {busy_p99:7.1f}   {len(busy):6d}"
        + (f"   ({probe.failures} failed)" if probe.failures else "")
    )
    print(f"\nupload/cp throughput: {up_mbs / cp_mbs:.2f}x  (upload/(cp + fsync): {up_mbs / cp_sync_mbs:.2f}x)")
    print(
        f"floor/cp throughput: {floor_mbs / cp_mbs:.2f}x  (floor/(cp + fsync): {floor_mbs / cp_sync_mbs:.2f}x); "
        f"upload/floor: {up_mbs / floor_mbs:.2f}x"
    )
    print(
        f"upload/floor per pair (each floor measured just before its upload): "
        f"{', '.join(f'{r:.2f}' for r in pair_ratios)}; median {statistics.median(pair_ratios):.2f}x"
    )
    print(
        "  floor, server alone, upload per pair (s): "
        + "; ".join(f"{f:.2f} {b:.2f} {r[1]:.2f}" for f, b, r in zip(floors, servers, runs))
    )
    print(
        f"the server alone takes {server_s / floor_s:.2f}x the floor's time (receiving the body, before any app "
        f"does anything); the upload {up_s - server_s:.2f} s more than the server alone"
    )
    print(
        f"healthz during/idle: p50 {busy_p50 / idle_p50:.1f}x, p99 {busy_p99 / idle_p99:.1f}x "
        f"(p99 during two uploads {busy_p99:.1f} ms)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1600, help="the bundle's weights, in MB")
    parser.add_argument("--repeat", type=int, default=3, help="uploads (and cps) to take the median of")
    parser.add_argument("--idle-s", type=float, default=3.0, help="how long to probe /healthz with the farm idle")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where the bundle and the farm's data go (default: a temporary folder)",
    )
    parser.add_argument(
        "--drop-caches",
        action="store_true",
        help="empty the page cache before each floor and each upload (root only): the steadiest pairs",
    )
    parser.add_argument("--smoke", action="store_true", help="a few MB, one upload: checks that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.size_mb, args.repeat, args.idle_s = 4, 1, 0.5
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-upload-", dir=args.work_dir) as work:
        return run(args, Path(work))


if __name__ == "__main__":
    sys.exit(main())
