"""Test-only: a build whose artifact cannot load. A worker started with
``ENGINEFARM_BACKEND_WRAPPER=tests.unloadable_backend:UnloadableBackend`` runs its real backend, then leaves the
artifact reading its weights from a file beside it that it does not carry, as ONNX Runtime's optimized model of an
external-data bundle did. The build must then fail, and nothing be stored. Production code never names this module."""

from __future__ import annotations

from pathlib import Path

import onnx

from enginefarm.core.domain import EngineDescriptor, Target
from enginefarm.core.probe.machineprobe import MachineProbe
from enginefarm.core.spec import BuildSpec
from worker.backends.base import BuildBackend, BuildLog

MISSING = "weights.bin"


def point_outside(path: Path) -> None:
    """Rewrite the model at ``path`` so its weights live in ``weights.bin`` beside it, then drop that file."""
    model = onnx.load(str(path))
    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=MISSING, size_threshold=0
    )
    path.with_name(MISSING).unlink()


class UnloadableBackend(BuildBackend):
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
        desc = self.inner.build(model_path, spec, target, out_path, log, machine)
        point_outside(out_path)
        desc.sha256 = ""  # rewritten: the hash the inner backend took as it wrote no longer holds
        log.add(f"test backend: the artifact now reads its weights from {MISSING}, which it does not carry")
        return desc
