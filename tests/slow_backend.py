"""Test-only: a build the test suite can interrupt. A worker started with
``ENGINEFARM_BACKEND_WRAPPER=tests.slow_backend:SlowBackend`` wraps its real backend in this one; the build then
waits ``ENGINEFARM_TEST_BUILD_DELAY_S`` seconds before it runs for real, which is the window in which a fault test
kills the worker or cuts S3. Production code never names this module."""

from __future__ import annotations

import os
import time
from pathlib import Path

from enginefarm.core.domain import EngineDescriptor, Target
from enginefarm.core.probe.machineprobe import MachineProbe
from enginefarm.core.spec import BuildSpec
from worker.backends.base import BuildBackend, BuildLog


class SlowBackend(BuildBackend):
    def __init__(self, inner: BuildBackend):
        self.inner = inner
        self.backend = inner.backend

    def version(self) -> str:
        return self.inner.version()

    def build(
        self,
        model_path: Path,
        spec: BuildSpec,
        target: Target,
        out_path: Path,
        log: BuildLog,
        machine: MachineProbe | None,
    ) -> EngineDescriptor:
        delay = float(os.environ.get("ENGINEFARM_TEST_BUILD_DELAY_S", "0"))
        log.add(f"test backend: waiting {delay:g} s before the build")
        time.sleep(delay)
        return self.inner.build(model_path, spec, target, out_path, log, machine)
