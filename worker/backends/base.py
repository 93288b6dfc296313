"""The build backend interface: turn an ONNX file into an engine file for one target."""

from __future__ import annotations

import platform
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from enginefarm.core.domain import Backend, EngineDescriptor, Target
from enginefarm.core.probe.machineprobe import MachineProbe, normalize_platform
from enginefarm.core.spec import BuildSpec


@dataclass
class BuildLog:
    """The tail of a builder's log, kept for the catalog (full logs can run to megabytes)."""

    limit: int = 60
    lines: deque[str] = field(default_factory=deque)

    def add(self, line: str) -> None:
        self.lines.append(line)
        while len(self.lines) > self.limit:
            self.lines.popleft()

    def tail(self) -> str:
        return "\n".join(self.lines)


class BuildBackend(ABC):
    """One way of building engines. ``version()`` raises BackendMissing where it cannot run."""

    backend: Backend

    @abstractmethod
    def version(self) -> str:
        """The backend's full version string, part of every engine's content address."""

    @abstractmethod
    def build(
        self,
        model_path: Path,
        spec: BuildSpec,
        target: Target,
        out_path: Path,
        log: BuildLog,
        machine: MachineProbe | None,
    ) -> EngineDescriptor:
        """Build ``model_path`` for ``target`` into ``out_path``; returns the engine's descriptor. A backend that
        hashed the file as it wrote it fills sha256 and size, and vouches for them: whatever rewrites the file
        afterwards clears them. Otherwise the caller fills them from the file. Model errors raise BuildFailed."""

    @staticmethod
    def host_platform() -> str:
        return normalize_platform(platform.machine())
