"""A submitted build as an object: wait for it, then download its engines (``client.build(...)`` returns one).

A ``BuildJob`` is also the build's JSON as the farm last answered it (a dict: ``job["tasks"]``), so code that
reads the answer keeps working."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from enginefarm.client.artifacts import PLAN, SUFFIX, kind_of_backend
from enginefarm.client.safepaths import UnsafeAnswer, in_folder, record_id, safe_name
from enginefarm.client.transport import size_of
from enginefarm.core.domain import FINAL_STATES
from enginefarm.core.errors import BuildFailed

if TYPE_CHECKING:
    from enginefarm.client.sdk import Client


class BuildJob(dict[str, Any]):
    def __init__(self, client: Client, build: dict[str, Any]):
        super().__init__(build)
        self._client = client

    @property
    def id(self) -> int:
        return cast("int", self["id"])

    @property
    def state(self) -> str:
        return cast("str", self["state"])

    @property
    def tasks(self) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", self["tasks"])

    @property
    def done(self) -> bool:
        return all(t["state"] in FINAL_STATES for t in self.tasks)

    def _update(self, build: dict[str, Any]) -> BuildJob:
        self.clear()
        self.update(build)
        return self

    def refresh(self) -> BuildJob:
        """Read the build's state again."""
        return self._update(self._client.get(f"/v1/builds/{self.id}"))

    def wait(
        self, timeout: float = 3600, poll: float = 0.5, on_update: Callable[[dict[str, Any]], None] | None = None
    ) -> BuildJob:
        """Wait until every task is final (TimeoutError after ``timeout`` seconds); returns the job."""
        return self._update(self._client.wait_build(self.id, timeout=timeout, poll=poll, on_update=on_update))

    def engines(self) -> dict[str, dict[str, Any]]:
        """The catalog record of each built engine, by target."""
        built = [t for t in self.tasks if t["state"] == "succeeded" and t["engine_id"]]
        ids = {t["target"]: record_id(t["engine_id"], "the engine of " + str(t["target"])) for t in built}
        return {target: self._client.get(f"/v1/engines/{engine_id}") for target, engine_id in ids.items()}

    def download_all(self, dest: Path, *, strict: bool = True) -> dict[str, Path]:
        """Download every built engine into the folder ``dest`` (``<target>.plan``, ``.onnx`` for ONNX Runtime, the
        target made a strict file name), each verified by sha256 and size; returns the paths by target. Two targets
        that would share a file name are refused before anything is downloaded. ``strict``: raise BuildFailed when a
        task did not succeed (after downloading the others); a task not final yet is an error either way."""
        if not self.done:
            raise RuntimeError(f"build {self.id} is still running: wait() for it first")
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        engines, paths = self.engines(), {}
        for target, engine in engines.items():
            name = safe_name(target.replace("/", "-"), "engine") + SUFFIX[kind_of_backend(engine["backend"]) or PLAN]
            paths[target] = in_folder(dest, name)
        if len(set(paths.values())) < len(paths):
            raise UnsafeAnswer(f"build {self.id}: targets {sorted(paths)} would share a file name in {dest}")
        for target, engine in engines.items():
            self._client.download(engine["id"], paths[target], engine["sha256"], size=size_of(engine))
        failed = [t for t in self.tasks if t["state"] != "succeeded"]
        if strict and failed:
            raise BuildFailed(
                f"build {self.id}: {len(failed)} of {len(self.tasks)} target(s) did not succeed: "
                + "; ".join(f"{t['target']}: {t['error'] or t['state']}" for t in failed)
            )
        return paths
