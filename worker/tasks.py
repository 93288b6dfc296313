"""The Celery tasks: build an engine, benchmark and check one, quantize a model. Each claims its row in the
catalog first, so a redelivered message never runs work twice. No TensorRT logic here."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from functools import lru_cache

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init

from enginefarm.core.config import get_settings
from enginefarm.core.domain import Backend, ModelInfo, Target, TaskState
from enginefarm.core.errors import BuildFailed, EnginefarmError, InfrastructureError, TargetUnavailable
from enginefarm.core.probe.machineprobe import MachineProbe, machine_fingerprint, probe_machine
from enginefarm.core.spec import Precision
from enginefarm.core.validation import target_precision
from enginefarm.core.workerid import current_worker_id
from enginefarm.core.worklock import Scratch
from storage import builtengines, catalog, checks, quantizing, queue
from storage.blobs import engine_key, get_blob_store
from storage.blobwrite import store_with_row
from storage.db import PATIENCE_S, UNAVAILABLE, get_engine, in_transaction, session_scope
from storage.queue import BENCHMARK_TASK, BUILD_TASK, QUANTIZE_TASK, celery_app
from worker.backends import BuildLog, get_backend
from worker.fp16.stage import spec_of_task
from worker.int8.stage import model_of_task
from worker.pipeline import engine_from_model, fetch_verified, model_file_from_store, samples_of
from worker.process.lanes import wait_for_builds
from worker.process.metrics import BENCHMARK_SECONDS, BUILD_SECONDS

log = logging.getLogger(__name__)
MAX_INFRA_RETRIES = 5
app = celery_app()  # the queue's app (storage.queue): the tasks below are registered on it


@worker_process_init.connect
def _fresh_connections(**_kwargs) -> None:
    # A forked pool process must not share the parent's database sockets.
    get_engine().dispose(close=False)


@lru_cache
def local_machine() -> MachineProbe:
    return probe_machine()


def blob_store():
    return get_blob_store(get_settings())  # one per process: get_blob_store keeps it


def _backoff(retries: int) -> int:
    return min(60, 2**retries)


def _crash_reason(what: str, task_id: int, exc: Exception, limit_s: float) -> str:
    """Why a task failed that its own error handling did not expect: its time limit, else a crash (logged)."""
    if isinstance(exc, SoftTimeLimitExceeded):
        return f"the {what} ran past its time limit of {limit_s:g} s"
    log.exception("%s task %s crashed", what, task_id)
    return f"internal error in the worker: {type(exc).__name__}: {exc}"


def _infra_reason(exc: Exception) -> str:
    """Why a task goes back to the queue: S3 or the broker (an InfrastructureError), or the database."""
    message = getattr(exc, "message", None) or f"the catalog database was unavailable ({type(exc).__name__})"
    return f"retrying after an infrastructure error: {message}"


# --------------------------------------------------------------------------- build


_limits = get_settings()
# Every task: retried after an infrastructure error, its message acknowledged only once it ran (or its worker died).
TASK: dict = {"bind": True, "acks_late": True, "reject_on_worker_lost": True, "max_retries": MAX_INFRA_RETRIES}


@app.task(
    name=BUILD_TASK, soft_time_limit=_limits.build_soft_time_limit_s, time_limit=_limits.build_time_limit_s, **TASK
)
def build_engine(self, task_id: int) -> None:
    """Every catalog write here outlasts a database restart (``in_transaction`` retries it), so a task never
    stays "running" because its final state could not be written."""
    me = current_worker_id()
    if not in_transaction(catalog.claim_task, task_id, me, get_settings().max_deliveries):
        log.info("task %s is not queued any more (taken or finished); skipping", task_id)
        return
    try:
        _run(task_id, me)
    except (InfrastructureError, *UNAVAILABLE) as exc:  # S3, the broker or the database: retried with backoff
        in_transaction(catalog.requeue_task, task_id, _infra_reason(exc))
        raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from exc
    except (BuildFailed, TargetUnavailable) as exc:
        in_transaction(catalog.fail_task, task_id, exc.message, exc.log_tail)
    except Exception as exc:  # noqa: BLE001 - logged: an unexpected error (or the time limit) still ends the task
        reason = _crash_reason("build", task_id, exc, get_settings().build_soft_time_limit_s)
        in_transaction(catalog.fail_task, task_id, reason)


def _after_build(check_id: int | None, target: Target) -> None:
    """Hand the new engine to the benchmark stage. Full TensorRT builds on the GPU the engine runs on, so
    this worker benchmarks it now, one after the other; other engines go to a worker that can run them."""
    if check_id is None:
        return
    if target.backend is Backend.TENSORRT:
        run_benchmark_now(check_id)
    else:
        queue.publish_benchmark(check_id, target)


def _run(task_id: int, me: str) -> None:
    from worker.measure.reference import ensure_reference  # numpy and ONNX Runtime: in the pool process only

    settings = get_settings()
    store = blob_store()
    with session_scope() as s:
        task = catalog.get_task(s, task_id)
        # An int8 build may have one derived model per target family (worker/int8/stage.py).
        build, model = task.build, model_of_task(s, task)
        # An fp16 build with accuracy repair keeps the nodes its repair stage found in fp32 (worker/fp16/stage.py).
        target, spec = task.parsed_target, spec_of_task(build)
        repaired = spec.keep_fp32_layers != build.build_spec.keep_fp32_layers
        # A target that cannot build the spec's precision builds the nearest it can (enginefarm.core.validation);
        # the engine records the precision it has, under the spec hash that was asked for.
        precision, precision_note = target_precision(spec, target, ModelInfo.from_dict(model.info))
        spec = spec.model_copy(update={"precision": precision})
        spec_hash, model_fields = build.spec_hash, (model.blob_key, model.sha256, model.format)
        backend_version = get_backend(target.backend).version()
        existing = builtengines.find_engine(s, model.sha256, spec_hash, str(target), backend_version)
        project = model.project
        if existing is not None:  # identical work never runs twice
            catalog.finish_task_reused(s, task, existing)
            check = checks.ensure_benchmark_task(s, existing, spec, model.project)
            check_id, engine_id = (check.id if check else None), existing.id
    if existing is not None:
        ensure_reference(engine_id, project)
        _after_build(check_id, target)
        return
    log_buf = BuildLog(limit=settings.log_tail_lines)
    if precision_note:
        log_buf.add(precision_note)
    if repaired and precision is Precision.FP16:
        log_buf.add(f"fp16 accuracy repair of this build: kept in fp32 {', '.join(spec.keep_fp32_layers)}")
        if target.backend is Backend.TENSORRT and not spec.strongly_typed:
            log_buf.add(
                "fp16 accuracy repair: not applied here: TensorRT without strongly_typed picks each layer's "
                "precision itself (strongly_typed: true builds the converted graph, which keeps them)"
            )
    model_path = model_file_from_store(store, *model_fields, settings)
    with Scratch(settings) as scratch:
        try:
            built = engine_from_model(model_path, spec, target, local_machine(), scratch, log_buf)
        except EnginefarmError as exc:
            exc.log_tail = log_buf.tail()
            raise
        BUILD_SECONDS.labels(str(target)).observe(built.seconds)
        key = engine_key(built.descriptor.sha256)

        def record(s) -> tuple[int, int | None]:
            task = catalog.get_task(s, task_id)
            engine = builtengines.record_engine(
                s,
                task,
                task.build.model,
                built.descriptor,
                spec_hash=spec_hash,
                blob_key=key,
                build_seconds=built.seconds,
                worker_id=me,
                log_tail=log_buf.tail(),
            )
            check = checks.ensure_benchmark_task(s, engine, spec, task.build.model.project)
            return engine.id, (check.id if check else None)

        # The blob is complete and verified before the row points at it. If another task catalogued the same
        # engine first (engines are not always bit-identical), our bytes are left to no row and go again.
        engine_id, check_id = store_with_row(
            settings, store, key, built.path, built.descriptor.sha256, record, patience_s=PATIENCE_S
        )
    # Before the check is published: once an engine's check is done, its reference outputs are there for devices.
    ensure_reference(engine_id, project)
    _after_build(check_id, target)


# --------------------------------------------------------------------------- benchmark and accuracy


@app.task(
    name=BENCHMARK_TASK, soft_time_limit=_limits.bench_soft_time_limit_s, time_limit=_limits.bench_time_limit_s, **TASK
)
def benchmark_engine(self, task_id: int) -> None:
    try:
        run_benchmark_now(task_id, reraise_infra=True, give_way=True)
    except (InfrastructureError, *UNAVAILABLE) as exc:
        raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from exc


def run_benchmark_now(task_id: int, reraise_infra: bool = False, give_way: bool = False) -> None:
    """Claim the benchmark task and run it in this process; every outcome ends in the catalog. ``give_way``: in a
    benchmark lane, measure once this worker's builds are done (``lanes.wait_for_builds``)."""
    me = current_worker_id()
    if not in_transaction(checks.claim_benchmark, task_id, me, get_settings().max_deliveries):
        log.info("benchmark task %s is not queued any more; skipping", task_id)
        return
    try:
        _benchmark(task_id, me if give_way else None)
    except (InfrastructureError, *UNAVAILABLE) as exc:
        in_transaction(checks.end_benchmark, task_id, TaskState.QUEUED, _infra_reason(exc))
        if reraise_infra:
            raise
    except EnginefarmError as exc:  # the engine does not load or run here, the model or samples are bad
        in_transaction(checks.end_benchmark, task_id, TaskState.FAILED, exc.message)
    except Exception as exc:  # noqa: BLE001 - logged by _crash_reason
        reason = _crash_reason("benchmark", task_id, exc, get_settings().bench_soft_time_limit_s)
        in_transaction(checks.end_benchmark, task_id, TaskState.FAILED, reason)


def _benchmark(task_id: int, give_way_to: str | None = None) -> None:
    from worker.measure.evaluate import evaluate

    settings, store = get_settings(), blob_store()
    with session_scope() as s:
        task = checks.get_benchmark_task(s, task_id)
        project = task.project
        # The project's own model of these bytes: its samples and its reference, never another project's.
        engine, model = builtengines.engine_in_project(s, task.engine_id, project)
        # Accuracy is judged against the original: a derived int8 model's source, else the model itself.
        reference = catalog.get_model(s, model.source_model_id) if model.source_model_id else model
        # Judged by the precision the engine has: a target may have built another than the spec asked for.
        spec = task.build_spec.model_copy(update={"precision": Precision(engine.precision)})
        info = ModelInfo.from_dict(reference.info)
        engine_fields = (engine.id, engine.blob_key, engine.sha256, engine.backend)
        run_options = dict(engine.run_options or {})
        target = task.parsed_target
        ref_fields = (reference.blob_key, reference.sha256, reference.format)
        samples_fields = (reference.samples_key, reference.samples_sha256)
    engine_id, blob_key, sha, backend = engine_fields
    ref_path = model_file_from_store(store, *ref_fields, settings)
    probe = local_machine()
    gpu = next(({"name": g.name, "compute_capability": g.compute_capability} for g in probe.gpus[:1]), None)
    with Scratch(settings) as scratch:
        engine_path = fetch_verified(store, blob_key, sha, scratch / "engine.plan")
        samples = samples_of(store, *samples_fields, info, scratch)
        if give_way_to:
            wait_for_builds(give_way_to)
        started = time.monotonic()
        try:
            result = evaluate(
                engine_path,
                backend,
                spec,
                info,
                ref_path,
                samples,
                gpu,
                target=target,
                reraise=(SoftTimeLimitExceeded, InfrastructureError, *UNAVAILABLE),
                run_options=run_options,
            )
        except BuildFailed as exc:  # the engine does not load here: it must never be handed out as unchecked
            in_transaction(
                checks.record_verdict,
                engine_id,
                project,
                {"pass": False, "error": f"the engine did not load: {exc.message}"},
                task_id=task_id,
            )
            raise
        BENCHMARK_SECONDS.labels(str(target)).observe(time.monotonic() - started)
    fingerprint = {**asdict(machine_fingerprint(probe)), "hostname": probe.hostname, "worker": current_worker_id()}
    with session_scope() as s:
        for measured in result.benchmarks:
            checks.record_benchmark(
                s,
                engine_id,
                project=project,
                shape_key=measured.shape.key,
                shapes=measured.shape.shapes,
                machine=fingerprint,
                gpu_name=result.gpu_name,
                cpu_name=probe.cpu_name,
                compute_capability=result.compute_capability,
                stats=measured.stats,
            )
        if result.accuracy is not None:
            checks.record_verdict(
                s,
                engine_id,
                project,
                result.accuracy,
                task_id=task_id,
                device_memory_bytes=result.device_memory_bytes,
                run_options=result.run_options,
            )
        elif result.errors and (spec.accuracy.enabled or not result.benchmarks):
            # The check was asked for and could not run on the engine, or nothing ran at all: a failed verdict,
            # so resolve never hands it out as merely unchecked.
            checks.record_verdict(
                s, engine_id, project, {"pass": False, "error": "; ".join(result.errors)}, task_id=task_id
            )
        # Whatever was measured is kept; a part that did not run makes the check fail with the reason.
        if result.errors:
            checks.end_benchmark(s, task_id, TaskState.FAILED, "; ".join(result.errors))
        else:
            checks.end_benchmark(s, task_id, TaskState.SUCCEEDED)


# --------------------------------------------------------------------------- int8 quantization


@app.task(name=QUANTIZE_TASK, **TASK)
def quantize_model(self, build_id: int) -> None:
    from worker.int8 import stage as quantize_stage

    me = current_worker_id()
    if not in_transaction(quantizing.claim_quantize, build_id, me):
        log.info("build %s has no queued quantization; skipping", build_id)
        return
    try:
        queued = quantize_stage.run(build_id, blob_store(), get_settings())
    except (InfrastructureError, *UNAVAILABLE) as exc:
        in_transaction(quantizing.set_quantize, build_id, "queued", error=_infra_reason(exc))
        raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from exc
    except Exception as exc:
        if not isinstance(exc, EnginefarmError):
            log.exception("quantization of build %s crashed", build_id)
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        in_transaction(quantizing.fail_quantize, build_id, message)
        return
    for task_id, target in queued:
        queue.publish_build(task_id, target)
