"""Test-only: a build the test suite can interrupt. The worker wraps its real backend in this one when
``ENGINEFARM_TEST_BACKENDS`` is set; the build then waits ``ENGINEFARM_TEST_BUILD_DELAY_S`` seconds before it
runs for real, which is the window in which a fault test kills the worker or cuts S3."""

from __future__ import annotations

import time
from pathlib import Path

from enginefarm.config import get_settings
from enginefarm.domain import BuildSpec, EngineDescriptor, Target
from worker.backends.base import BuildBackend, BuildLog
from worker.probe import MachineProbe


class SlowBackend(BuildBackend):
    def __init__(self, inner: BuildBackend):
        self.inner = inner
        self.backend = inner.backend

    def version(self) -> str:
        return self.inner.version()

    def build(self, model_path: Path, spec: BuildSpec, target: Target, out_path: Path, log: BuildLog,
              machine: MachineProbe | None) -> EngineDescriptor:
        delay = get_settings().test_build_delay_s
        log.add(f"test backend: waiting {delay:g} s before the build")
        time.sleep(delay)
        return self.inner.build(model_path, spec, target, out_path, log, machine)
