"""The Python client for the farm's REST API (httpx): models, builds, checks, resolution and fetch. The CLI is built on
it; the connection and the downloads it makes are ``Transport``'s (transport)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from enginefarm.client.artifacts import check_bytes, destination, place_cached, write_session_file
from enginefarm.client.cache import EngineCache
from enginefarm.client.errors import ApiError, api_error
from enginefarm.client.jobs import BuildJob
from enginefarm.client.offline import query_filters
from enginefarm.client.transport import ProgressReader, Transport, size_of
from enginefarm.core.domain import FINAL_STATES, SCOPES, scope_allows
from enginefarm.core.errors import BuildFailed, Forbidden, ModelRejected, NotFound, Unauthorized
from enginefarm.core.fleet import Measurement
from enginefarm.core.hashing import sha256_file
from enginefarm.core.machine import Machine
from enginefarm.core.names import upload_problems
from enginefarm.core.wanted import EngineFilter

NO_UPLOAD_TOKEN = "uploading needs an API token with scope 'build': set ENGINEFARM_TOKEN or pass --token"
BUILD_WAIT_S = 20.0  # how long one request for a build's next answer waits at the farm (its limit: 30 s)


class Client(Transport):
    """The farm's API: upload and build models, wait for builds and checks, resolve and fetch engines. Made with
    ``Client(base_url, timeout, token)``; the connection, ``get`` and the downloads (``download``,
    ``download_model``, ``cached``) are ``Transport``'s."""

    # ------------------------------------------------------------------ models and builds

    def health(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self.get("/healthz"))

    def upload(
        self,
        model: Path | str | bytes,
        name: str | None = None,
        version: str | None = None,
        on_bytes: Callable[[int], None] | None = None,
        project: str | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """Upload a model (a path to an .onnx file or bundle, or its bytes); returns (model, created).

        Idempotent by sha256: when the farm already holds these bytes under this name (and version, when given),
        that model is returned and nothing is sent. ``name`` defaults to the file's stem; bytes need one. Streams
        from disk."""
        version, project = version or None, project or None  # the form leaves an empty one out
        if isinstance(model, bytes):
            if not name:
                raise ValueError("name the model: upload(data, name=...)")
            _check_form(name, version, project)
            sha, filename = hashlib.sha256(model).hexdigest(), f"{name}.onnx"
        else:
            path = Path(model)
            name = name or path.stem
            _check_form(name, version, project)
            sha, filename = sha256_file(path), path.name
        try:
            found = self.models(name=name, sha256=sha, project=project, limit=500)["items"]
        except ApiError as exc:  # no token at all: say what an upload needs, not what the lookup did
            if exc.status_code == 401 and not self.http.headers.get("authorization"):
                raise api_error(401, Unauthorized(NO_UPLOAD_TOKEN).to_dict()) from None
            raise
        held = [
            m for m in found if (not version or m["version"] == version) and (m.get("project") or "") == (project or "")
        ]
        if held:
            return held[0], False
        self._may_upload(project)
        data = {"name": name} | ({"version": version} if version else {}) | ({"project": project} if project else {})
        body: Any = model if isinstance(model, bytes) else ProgressReader(path, on_bytes)  # httpx reads it as a file
        try:
            response = self.http.post(
                "/v1/models", data=data, timeout=None, files={"file": (filename, body, "application/octet-stream")}
            )
        finally:
            if not isinstance(body, bytes):
                body.close()
        return self._json(response), response.status_code == 201

    def _may_upload(self, project: str | None) -> None:
        """What the farm would refuse only after the last byte of an upload, refused before the first: a token that
        may not upload, none where one is needed, and a project's token naming another project. A farm without GET
        /v1/tokens/current says so after the upload."""
        try:
            me = self.get("/v1/tokens/current")
        except ApiError as exc:
            if exc.status_code in (403, 404, 405):  # a farm from before it (where /v1/tokens/* needed admin)
                return
            raise
        if me["scope"] not in SCOPES:  # a scope this client does not know: the farm decides
            return
        if not scope_allows(me["scope"], "build"):
            if not self.http.headers.get("authorization"):  # a farm that lets anyone read
                raise api_error(401, Unauthorized(NO_UPLOAD_TOKEN).to_dict())
            refused = f"token '{me['name']}' has scope '{me['scope']}'; POST /v1/models needs 'build'"
            raise api_error(403, Forbidden(refused).to_dict())
        if me["project"] is not None and project not in (None, me["project"]):
            refused = f"this token belongs to project {me['project']!r}; it cannot upload to project {project!r}"
            raise api_error(403, Forbidden(refused).to_dict())

    def upload_samples(self, model_id: int, path: Path) -> dict[str, Any]:
        """Store an .npz of sample inputs with a model (int8 calibration, accuracy checks); returns the model."""
        path = Path(path)
        with path.open("rb") as f:
            files = {"file": (path.name, f, "application/octet-stream")}
            response = self.http.post(f"/v1/models/{model_id}/samples", files=files, timeout=None)
        return cast("dict[str, Any]", self._json(response))

    def build(
        self,
        model: int | str,
        targets: list[str],
        spec: dict[str, Any] | None = None,
        queue_without_worker: bool | None = None,
    ) -> BuildJob:
        """Submit a build of ``model`` (an id, ``name`` for its latest version, or ``name:version``); returns the
        job (``job.wait()``, ``job.download_all(folder)``). ``queue_without_worker``: queue targets no live worker
        serves now, to wait for one; without it the farm refuses them (409) unless its
        ENGINEFARM_QUEUE_WITHOUT_WORKER says otherwise."""
        body = {
            "model_id": self.model_id(model),
            "targets": targets,
            "spec": spec or {},
            **_queueing(queue_without_worker),
        }
        return BuildJob(self, self._json(self.http.post("/v1/builds", json=body)))

    def job(self, build_id: int) -> BuildJob:
        """The job of a build submitted earlier."""
        return BuildJob(self, self.get(f"/v1/builds/{build_id}"))

    def model_id(self, model: int | str) -> int:
        """A model's id from an id, ``"name"`` (its latest version), ``"name:version"`` or ``"7"``.
        Raises NotFound when the catalog has no such model."""
        if isinstance(model, int) or model.isdigit():
            return int(model)
        name, _, version = model.rpartition(":") if ":" in model else (model, "", "")
        uploaded = [m for m in self.models(name=name, limit=500)["items"] if not m.get("source_model_id")]
        if not uploaded:
            raise NotFound(f"no model {name!r} in the catalog (see `enginefarm ls models`)")
        if not version:
            return cast("int", max(uploaded, key=lambda m: m["id"])["id"])
        match = [m for m in uploaded if m["version"] == version]
        if not match:
            raise NotFound(
                f"no model {name!r} version {version!r}; it has "
                + ", ".join(m["version"] for m in sorted(uploaded, key=lambda m: m["id"]))
            )
        return cast("int", match[0]["id"])

    def sweep(
        self,
        model_id: int,
        targets: list[str],
        axes: dict[str, list[Any]],
        spec: dict[str, Any] | None = None,
        queue_without_worker: bool | None = None,
    ) -> dict[str, Any]:
        body = {"model_id": model_id, "targets": targets, "spec": spec or {}, "axes": axes}
        body |= _queueing(queue_without_worker)
        return cast("dict[str, Any]", self._json(self.http.post("/v1/sweeps", json=body)))

    def report(self, model_id: int) -> dict[str, Any]:
        return cast("dict[str, Any]", self.get(f"/v1/models/{model_id}/report"))

    def wait_checks(
        self,
        model_id: int,
        timeout: float = 600,
        poll: float = 0.5,
        on_update: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll a model's report until no engine's benchmark is queued or running; returns the report. Engines
        that no live worker can benchmark stay pending with their reason and do not hold this up."""
        deadline = time.monotonic() + timeout
        while True:
            report = self.report(model_id)
            if on_update:
                on_update(report)
            busy = report["checks_in_progress"]
            if not busy:
                return report
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(busy)} benchmark(s) of model {model_id} not finished after {timeout} s")
            time.sleep(poll)

    def wait_build(
        self,
        build_id: int,
        timeout: float = 3600,
        poll: float = 0.5,
        on_update: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Wait until every task of a build is final; returns the build. Each request waits at the farm until the
        build's answer changes (a long poll, ``GET /v1/builds/{id}?wait=`` with the last answer's ETag), so a
        finished build is seen at once; ``on_update`` gets every new answer. A farm that does not wait (no ETag) is
        asked again every ``poll`` seconds."""
        deadline = time.monotonic() + timeout
        path = f"/v1/builds/{build_id}"
        first, tag = self.get_changed(path, None, 0)
        build: dict[str, Any] = first
        while True:
            if on_update:
                on_update(build)
            if all(t["state"] in FINAL_STATES for t in build["tasks"]):
                return build
            changed = None
            while changed is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"build {build_id} not finished after {timeout} s")
                if tag is None:
                    time.sleep(min(poll, left))
                changed, tag = self.get_changed(path, tag, min(BUILD_WAIT_S, left))
            build = changed

    def models(self, **filters: Any) -> dict[str, Any]:
        return cast("dict[str, Any]", self.get("/v1/models", **filters))

    def engines(self, limit: int = 50, offset: int = 0, **filters: Any) -> dict[str, Any]:
        """A page of engines; ``filters`` are ``EngineFilter``'s (model, version, target, backend, cc, trt,
        precision, spec_hash), checked before anything is sent."""
        wanted = EngineFilter(**filters).model_dump(exclude_none=True)
        return cast("dict[str, Any]", self.get("/v1/engines", **wanted, limit=limit, offset=offset))

    def builds(self, **filters: Any) -> list[dict[str, Any]]:
        """Builds, newest first; filters: model_id, spec_hash, limit, offset."""
        return cast("list[dict[str, Any]]", self.get("/v1/builds", **filters))

    def workers(self) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", self.get("/v1/workers"))

    def post_measurement(self, engine_id: int, measurement: Measurement) -> dict[str, Any]:
        """Post what this machine measured of an engine (a token of scope ``measure``); returns it as recorded."""
        body = measurement.model_dump(mode="json", exclude_none=True)
        return cast("dict[str, Any]", self._json(self.http.post(f"/v1/engines/{engine_id}/measurements", json=body)))

    def measurements(self, engine_id: int, source: str | None = None) -> dict[str, Any]:
        """An engine's figures, the farm's and the fleet's (``source``: only one), with the fleet's per class."""
        query = {"source": source} if source else {}
        return cast("dict[str, Any]", self.get(f"/v1/engines/{engine_id}/measurements", **query))

    # ------------------------------------------------------------------ resolution and fetch

    def resolve(
        self,
        model: str,
        machine: Machine | None = None,
        *,
        version: str | None = None,
        explain: bool = False,
        build: bool = False,
        cache: EngineCache | None = None,
        allow_cpu: bool = False,
        **filters: Any,
    ) -> dict[str, Any]:
        """POST /v1/resolve. Filters: precision, spec_hash, accuracy ("pass"), max_latency_ms, backend, and
        accept (["unchecked"] for int8/fp8 engines never checked, ["failed"] for engines that failed the check).
        What the machine will run (its shapes) and the precisions it accepts travel with ``machine``.
        ``allow_cpu``: a machine that names a GPU runtime also takes an ONNX Runtime artifact when no engine of
        its runtime fits (``accept: ["cpu"]``); without it the farm answers 404 with what would fit.

        ``machine`` defaults to this machine, detected (``enginefarm.core.probe.machineprobe.this_machine``).
        Returns the
        resolution, or with ``build`` and nothing fitting, the submitted build (it has ``build_id``).
        Raises ApiError (404) when nothing fits. With ``cache``, the answer is kept there and the next identical
        question is asked with If-None-Match: a 304 reuses it.
        """
        if machine is None:
            from enginefarm.core.probe.machineprobe import this_machine

            machine = this_machine()
        body = {
            "model": model,
            "version": version,
            "machine": asdict(machine),
            "explain": explain,
            "build": build,
            **query_filters(filters, allow_cpu),
        }
        if cache is None:
            return cast("dict[str, Any]", self._json(self.http.post("/v1/resolve", json=body)))
        # Asked before: the farm answers 304 while its answer is the one kept here.
        question = json.dumps({"farm": str(self.http.base_url), **body}, sort_keys=True)
        kept = cache.answer(question)
        r = self.http.post("/v1/resolve", json=body, headers={"If-None-Match": kept[0]} if kept else {})
        if r.status_code == 304 and kept:
            return kept[1]
        answer = self._json(r)
        if r.status_code == 200 and r.headers.get("etag"):
            cache.keep_answer(question, r.headers["etag"], answer)
        return cast("dict[str, Any]", answer)

    def fetch(
        self,
        model: str,
        dest: Path | str | None = None,
        machine: Machine | None = None,
        *,
        cache: EngineCache | None = None,
        build: bool = False,
        wait: bool = False,
        wait_timeout: float = 3600,
        explain: bool = False,
        allow_cpu: bool = False,
        on_bytes: Callable[[int], None] | None = None,
        on_build: Callable[[dict[str, Any]], None] | None = None,
        on_size: Callable[[int], None] | None = None,
        **filters: Any,
    ) -> Fetched:
        """Resolve the engine for ``machine`` and put it at ``dest``, verified.

        ``dest`` None (or a folder) writes the file named by what it is: ``<model>-<target>.plan`` for a TensorRT
        or TensorRT-RTX engine, ``.onnx`` for an ONNX Runtime artifact. A ``dest`` whose name says another kind
        (``x.plan`` for an ONNX model, ``x.onnx`` for a plan) raises WrongArtifact before anything is downloaded;
        bytes that are not the kind the catalog records raise IntegrityError. Either way nothing is written there.
        ``allow_cpu``: see ``resolve``. With a cache, an engine already cached (by sha256) is copied from it and
        not downloaded. With ``build``, a machine nothing fits gets a build submitted; with ``wait`` too, the
        engine is fetched once that build is done. ``on_size`` hears the engine's size in bytes before
        ``on_bytes`` hears the first of them (a progress bar's total).
        """
        answer = self.resolve(model, machine, build=build, explain=explain, cache=cache, allow_cpu=allow_cpu, **filters)
        if "build_id" in answer:
            if not wait:
                return Fetched(answer, None, False, answer)
            done = self.wait_build(answer["build_id"], timeout=wait_timeout, on_update=on_build)
            failed = [t for t in done["tasks"] if t["state"] != "succeeded"]
            if failed:
                raise BuildFailed(
                    f"build {done['id']} for {answer['target']} did not succeed: "
                    f"{failed[0]['error'] or failed[0]['state']}"
                )
            submitted, answer = answer, self.resolve(model, machine, explain=explain, allow_cpu=allow_cpu, **filters)
        else:
            submitted = None
        eng = answer["engine"]
        dest = destination(eng, dest)
        if on_size is not None:
            on_size(eng["size"])
        if cache is None:
            # Staged beside the destination and checked there: a file of the wrong kind never takes its name.
            size, check = size_of(eng), partial(check_bytes, eng)
            self.download(eng["id"], dest, eng["sha256"], on_bytes, size=size, verify=check)
            write_session_file(eng, dest)
            return Fetched(answer, dest, False, submitted)
        _, hit = self.cached(eng, cache, on_bytes)
        placed = place_cached(cache, eng, dest)
        write_session_file(eng, placed)
        return Fetched(answer, placed, hit, submitted)


def _check_form(name: str, version: str | None, project: str | None) -> None:
    """The upload's form fields, by the farm's own rules (``core.names.upload_problems``): refused before hashing or
    sending anything, with the 422 the farm would answer after the upload."""
    if problems := upload_problems(name, version, project):
        raise api_error(422, ModelRejected("the upload's form fields are invalid", problems=problems).to_dict())


@dataclass
class Fetched:
    """What ``fetch`` did: the resolution, where the engine is, whether it came from the cache, and the
    build submitted for this machine (if any)."""

    answer: dict[str, Any]
    path: Path | None
    from_cache: bool
    build: dict[str, Any] | None = None


def _queueing(queue_without_worker: bool | None) -> dict[str, Any]:
    """The request field, only when the caller chose: left out, the farm's own default applies."""
    return {} if queue_without_worker is None else {"queue_without_worker": queue_without_worker}
