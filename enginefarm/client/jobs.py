"""A submitted build as an object: wait for it, then download its engines (``client.build(...)`` returns one).

A ``BuildJob`` is also the build's JSON as the farm last answered it (a dict: ``job["tasks"]``), so code that
reads the answer keeps working."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from enginefarm.core.domain import FINAL_STATES
from enginefarm.core.errors import BuildFailed

if TYPE_CHECKING:
    from enginefarm.client.sdk import Client

# The file each backend's engine is saved as.
SUFFIX = {"onnxruntime": ".onnx"}


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
        return {
            t["target"]: self._client.get(f"/v1/engines/{t['engine_id']}")
            for t in self.tasks
            if t["state"] == "succeeded" and t["engine_id"]
        }

    def download_all(self, dest: Path, *, strict: bool = True) -> dict[str, Path]:
        """Download every built engine into the folder ``dest`` (``<target>.plan``, ``.onnx`` for ONNX Runtime),
        each verified by sha256; returns the paths by target. ``strict``: raise BuildFailed when a task did
        not succeed (after downloading the others); a task not final yet is an error either way."""
        if not self.done:
            raise RuntimeError(f"build {self.id} is still running: wait() for it first")
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        paths = {}
        for target, engine in self.engines().items():
            path = dest / (re.sub(r"[^\w.-]+", "-", target) + SUFFIX.get(engine["backend"], ".plan"))
            self._client.download(engine["id"], path, engine["sha256"])
            paths[target] = path
        failed = [t for t in self.tasks if t["state"] != "succeeded"]
        if strict and failed:
            raise BuildFailed(
                f"build {self.id}: {len(failed)} of {len(self.tasks)} target(s) did not succeed: "
                + "; ".join(f"{t['target']}: {t['error'] or t['state']}" for t in failed)
            )
        return paths
