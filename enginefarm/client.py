"""The Python client for the farm's REST API (httpx). The CLI is built on it."""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

from enginefarm.config import get_settings
from enginefarm.domain import FINAL_STATES, Machine
from enginefarm.errors import EnginefarmError, IntegrityError

SHA_HEADER = "X-Content-SHA256"
CHUNK = 1 << 20


class ApiError(EnginefarmError):
    """A non-2xx answer from the farm, with the body it sent."""

    def __init__(self, status_code: int, body: Any):
        detail = body.get("detail") if isinstance(body, dict) else str(body)
        super().__init__(f"HTTP {status_code}: {detail}", problems=body.get("problems") if isinstance(body, dict) else None)
        self.status_code = status_code
        self.body = body


class _ProgressReader:
    """A file wrapper that reports bytes read, so uploads can drive a progress bar."""

    def __init__(self, path: Path, on_bytes: Callable[[int], None] | None):
        self._fh = open(path, "rb")
        self._on_bytes = on_bytes

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size if size and size > 0 else CHUNK)
        if self._on_bytes and data:
            self._on_bytes(len(data))
        return data

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read(CHUNK):
            yield chunk

    def close(self) -> None:
        self._fh.close()


class Client:
    def __init__(self, base_url: str | None = None, timeout: float = 60.0):
        self.base_url = (base_url or get_settings().api_url).rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = response.text
            raise ApiError(response.status_code, body)
        return response.json()

    def get(self, path: str, **params: Any) -> Any:
        return self._json(self.http.get(path, params={k: v for k, v in params.items() if v is not None}))

    # ------------------------------------------------------------------ models and builds

    def health(self) -> dict:
        return self.get("/healthz")

    def upload(self, path: Path, name: str, version: str | None = None,
               on_bytes: Callable[[int], None] | None = None) -> tuple[dict, bool]:
        """Upload a model file; returns (model, created). Streams from disk."""
        path = Path(path)
        reader = _ProgressReader(path, on_bytes)
        data = {"name": name} | ({"version": version} if version else {})
        try:
            response = self.http.post("/v1/models", data=data, files={"file": (path.name, reader, "application/octet-stream")},
                                      timeout=None)
        finally:
            reader.close()
        return self._json(response), response.status_code == 201

    def build(self, model_id: int, targets: list[str], spec: dict | None = None) -> dict:
        return self._json(self.http.post("/v1/builds", json={"model_id": model_id, "targets": targets, "spec": spec or {}}))

    def wait_build(self, build_id: int, timeout: float = 3600, poll: float = 0.5,
                   on_update: Callable[[dict], None] | None = None) -> dict:
        """Poll a build until every task is final; returns the build."""
        deadline = time.monotonic() + timeout
        while True:
            build = self.get(f"/v1/builds/{build_id}")
            if on_update:
                on_update(build)
            if all(t["state"] in FINAL_STATES for t in build["tasks"]):
                return build
            if time.monotonic() > deadline:
                raise TimeoutError(f"build {build_id} not finished after {timeout} s")
            time.sleep(poll)

    def models(self, **filters: Any) -> dict:
        return self.get("/v1/models", **filters)

    def engines(self, **filters: Any) -> dict:
        return self.get("/v1/engines", **filters)

    def builds(self) -> list[dict]:
        return self.get("/v1/builds")

    def workers(self) -> list[dict]:
        return self.get("/v1/workers")

    # ------------------------------------------------------------------ resolution and download

    def resolve(self, model: str, machine: Machine | None = None, *, version: str | None = None,
                precision: str | None = None) -> dict:
        m = asdict(machine or Machine())
        params = {"model": model, "version": version, "precision": precision, "cc": m["compute_capability"],
                  "gpu": m["gpu_name"], "memory_mib": m["memory_mib"], "driver": m["driver_version"],
                  "cuda": m["cuda_version"], "trt": m["trt_version"], "trt_rtx": m["trt_rtx_version"],
                  "lean": m["lean_runtime"] or None, "platform": m["platform"], "jetpack": m["jetpack"]}
        return self.get("/v1/resolve", **params)

    def download(self, engine_id: int, dest: Path, expected_sha256: str | None = None,
                 on_bytes: Callable[[int], None] | None = None) -> str:
        """Download an engine to ``dest`` atomically, verifying its sha256; returns the sha256."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        try:
            with os.fdopen(fd, "wb") as out, self.http.stream("GET", f"/v1/engines/{engine_id}/content", timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    self._json(r)
                header_sha = r.headers.get(SHA_HEADER)
                for chunk in r.iter_bytes(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    if on_bytes:
                        on_bytes(len(chunk))
            got = digest.hexdigest()
            for want in (expected_sha256, header_sha):
                if want and got != want:
                    raise IntegrityError(f"engine {engine_id}: downloaded sha256 {got}, catalog says {want}")
            os.replace(tmp, dest)
            return got
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def fetch(self, model: str, dest: Path, machine: Machine | None = None, **filters: Any) -> dict:
        """Resolve the engine for ``machine`` and download it to ``dest``; returns the resolution."""
        answer = self.resolve(model, machine, **filters)
        self.download(answer["engine"]["id"], dest, answer["engine"]["sha256"])
        return answer
