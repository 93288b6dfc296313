"""The one settings object. The API, the worker, the CLI and Alembic all read it.

Defaults serve the embedded mode (SQLite, a local blob directory, a broker that needs no
server). Production overrides them through ``ENGINEFARM_*`` environment variables or ``.env``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATA_DIR = Path.home() / ".enginefarm"
DEFAULT_API_URL = "http://127.0.0.1:8321"
# How long the API keeps an idle client connection open. Longer than clients keep theirs (httpx: 5 s), so a
# client never sends a request on a connection the server is closing at that moment (a ReadError under load).
KEEP_ALIVE_SECONDS = 75
GIB = 1 << 30


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGINEFARM_", env_file=".env", extra="ignore")

    data_dir: Path = DEFAULT_DATA_DIR
    database_url: str | None = None
    broker_url: str | None = None

    blob_store: Literal["local", "s3"] = "local"
    blob_dir: Path | None = None
    s3_endpoint_url: str | None = None
    s3_bucket: str = "enginefarm"
    s3_region: str = "us-east-1"
    s3_access_key: str | None = None
    s3_secret_key: str | None = None

    api_url: str = DEFAULT_API_URL
    max_upload_bytes: int = Field(default=8 * GIB, ge=1)
    max_bundle_files: int = Field(default=10_000, ge=1)
    # What a bundle may expand to, in all and against its packed size, judged from its directory before a byte is
    # written (at upload, and again in the worker). 0: twice max_upload_bytes, ample for weights (they compress
    # little) and bounded whatever the archive claims.
    max_unpacked_bytes: int = Field(default=0, ge=0)
    max_compression_ratio: float = Field(default=200.0, gt=1)
    max_targets_per_build: int = Field(default=64, ge=1)
    max_json_bytes: int = Field(default=1 << 20, ge=1024)  # a build spec, a sweep, a resolve query
    # An upload's form fields besides the file (name, version, project): how many, and their bytes together.
    max_form_fields: int = Field(default=32, ge=1)
    max_form_bytes: int = Field(default=256 << 10, ge=1024)

    # Admission control. An upload that sends nothing for this long is dropped; each token may have this many
    # uploads in flight; each token, and the farm as a whole, may have this many build tasks waiting to run.
    upload_idle_timeout_s: float = Field(default=60.0, gt=0)
    # How long a request's line and headers may take to arrive, from the connection's opening or the request's
    # first byte (a client dribbling headers holds a connection only this long); past it a 408 and a close.
    header_timeout_s: float = Field(default=30.0, gt=0)
    # What a request's head may hold, judged as it arrives, before it is parsed (server/headlimits.py):
    # its request line without the CRLF (past it a 414), its header block after the request line (bytes) and its
    # header lines (past either a 431); then a close.
    max_request_line_bytes: int = Field(default=8 << 10, ge=256)
    max_header_bytes: int = Field(default=64 << 10, ge=1024)
    max_header_fields: int = Field(default=100, ge=1)
    max_uploads_per_token: int = Field(default=4, ge=1)
    max_queued_tasks_per_token: int = Field(default=500, ge=1)
    max_queued_tasks: int = Field(default=5000, ge=1)
    # A build for a target no live worker serves: refused (409) unless the request says queue_without_worker,
    # or this is on.
    queue_without_worker: bool = False

    # How often a worker polls the embedded (database) broker: lower means less queue wait, more idle CPU.
    broker_poll_seconds: float = Field(default=0.05, gt=0)
    # A worker keeps up to this much memory its builds freed (glibc's mmap and trim thresholds;
    # worker/process/malloc.py): builds then fault in no fresh pages. 0: glibc's own thresholds.
    worker_malloc_keep_mib: int = Field(default=256, ge=0, le=2047)  # mallopt takes a C int of bytes
    # The malloc arenas an API process uses, at most (worker/process/malloc.py, limit_arenas; 0: glibc's own limit).
    api_malloc_arenas: int = Field(default=2, ge=0, le=64)
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    worker_ttl_seconds: float = Field(default=20.0, gt=0)
    worker_targets: str | None = None  # comma-separated override of the probed targets
    # Comma-separated targets whose engines this worker benchmarks, "none" for none; default: probed.
    worker_bench_targets: str | None = None
    max_samples_bytes: int = Field(default=256 << 20, ge=1)
    # The input tensors the farm allocates for a build (benchmark and accuracy inputs, the profiles' shapes): each
    # at most this many elements and bytes, and one set of inputs at most this many bytes together. Checked when a
    # spec is accepted (a 422 naming the input), so a worker never tries to allocate what it cannot.
    max_tensor_elements: int = Field(default=1 << 30, ge=1)
    max_tensor_bytes: int = Field(default=GIB, ge=1)
    max_inputs_bytes: int = Field(default=4 * GIB, ge=1)
    worker_concurrency: int = Field(default=1, ge=1)
    log_tail_lines: int = Field(default=400, ge=1)

    # Task limits: past the soft limit a task ends failed with the reason; past the hard one its process is
    # killed. A task delivered this many times without finishing is failed, not run again.
    build_soft_time_limit_s: float = Field(default=3600, gt=0)
    build_time_limit_s: float = Field(default=3900, gt=0)
    bench_soft_time_limit_s: float = Field(default=900, gt=0)
    bench_time_limit_s: float = Field(default=1000, gt=0)
    max_deliveries: int = Field(default=5, ge=1)
    shutdown_grace_seconds: float = Field(
        default=20.0,
        ge=0,
        description="On SIGTERM a worker stops taking tasks and gives its running builds and benchmarks this many "
        "seconds to finish; those still running then go back to the queue at once (the attempt not "
        "counted) for another worker, and the worker exits. Keep it about 10 s under the time its "
        "supervisor waits before SIGKILL (Kubernetes' terminationGracePeriodSeconds, 30 s by default; "
        "systemd's TimeoutStopSec): putting the tasks back and Celery's own shutdown take 1 to 5 s more "
        "on a busy machine. 0: put them back at once.",
    )
    # The reconciler (in the API process): how often it runs (0: never), and how long a queued task may sit
    # with its queue empty before its message is taken as lost and published again.
    reconcile_seconds: float = Field(default=15.0, ge=0)
    republish_after_seconds: float = Field(default=60.0, gt=0)
    # The blob garbage collector in the same thread: how often (0: never) and how old an unreferenced blob
    # must be before it goes (longer than any upload or build takes between storing a blob and its row).
    gc_interval_seconds: float = Field(default=3600.0, ge=0)
    gc_grace_seconds: float = Field(default=24 * 3600.0, ge=0)
    # ``enginefarm up``/``demo``: each child's log in the data dir (api.log, worker-NAME.log) is cut at this size,
    # its older half kept as NAME.log.1, so a farm that runs for months keeps at most twice this per child.
    log_max_mb: float = Field(default=64.0, gt=0)

    # Downloads from an S3 store: a 307 to a presigned URL valid this long (the bytes never pass through the API),
    # or, off, streamed through the API (for clients that cannot reach S3).
    download_redirect: bool = True
    download_url_ttl_s: int = Field(default=300, ge=10, le=7 * 24 * 3600)

    # How long an API process trusts a token it has looked up: the delay before a token revoked or expired
    # elsewhere is refused (0: look every token up on every request).
    token_cache_seconds: float = Field(default=5.0, ge=0, le=5)
    # Resolve answers each API process keeps by ETag (0: none), at most this many and this many MiB of bodies in all.
    # An answer is a few KB; an --explain answer of a model with many engines, tens of KB.
    resolve_cache_entries: int = Field(default=4096, ge=0, le=1_000_000)
    resolve_cache_mib: int = Field(default=16, ge=0, le=4096)
    # How long an API process trusts the model versions and generations it read for a resolve
    # (api/services/versions.py): the delay before an engine, benchmark, verdict or version written by another process
    # changes an answer or a 304 (0: read them on every request). A change made through the process itself counts at
    # once.
    resolve_fresh_seconds: float = Field(default=1.0, ge=0, le=5)
    # Threads of each API process that compute resolve answers (api/routes/resolve.py). Few: a computed answer is
    # mostly Python holding the GIL, and many threads handing it to each other cost more than they overlap.
    resolve_threads: int = Field(default=2, ge=1, le=64)
    # FastAPI's own OpenTelemetry spans, metrics and logs of each request, sent to the OpenTelemetry providers the
    # process is run with (e.g. under ``opentelemetry-instrument``). Off, the farm's metrics are GET /metrics'
    # (Prometheus) and no request looks for a provider, a look that costs a share of every small answer's CPU.
    opentelemetry: bool = False

    # Dashboard sign-ins: sessions one token may open a minute (in the catalog, across API processes), and attempts
    # one client address may make a minute (in each API process). Past either, a 429 with Retry-After.
    signin_per_minute_per_token: int = Field(default=10, ge=1)
    signin_per_minute_per_address: int = Field(default=30, ge=1)
    # Device measurements one token may post a minute (POST /v1/engines/{id}/measurements; in the catalog, across
    # API processes). Past it, a 429 with Retry-After.
    measurements_per_minute_per_token: int = Field(default=60, ge=1)
    # The proxies whose X-Forwarded-Proto and X-Forwarded-For the API believes (uvicorn's forwarded_allow_ips):
    # comma-separated addresses or CIDR ranges, or "*" where nothing but the proxy can reach the API. A TLS-terminating
    # proxy must be listed, or the API takes its requests for plain http (no Secure session cookie).
    forwarded_allow_ips: str = "127.0.0.1"

    # Reads (catalog, resolve, download) without a token. Writes always need one.
    anonymous_read: bool = False
    # Browser origins allowed to call the API (CORS); none by default.
    cors_origins: list[str] = Field(default_factory=list)

    # A class, as "module:Name", that every build backend is wrapped in: it is constructed with the real backend and
    # must offer the same methods (instrumentation, or a test's controllable build). None: the backends as they are.
    backend_wrapper: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

    @model_validator(mode="after")
    def _unpacked_limit(self) -> Settings:
        if not self.max_unpacked_bytes:
            self.max_unpacked_bytes = 2 * self.max_upload_bytes
        return self

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'catalog.db'}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{self.data_dir / 'broker.db'}"

    @property
    def resolved_blob_dir(self) -> Path:
        return self.blob_dir or self.data_dir / "blobs"

    @property
    def work_dir(self) -> Path:
        return self.data_dir / "work"

    def ensure_dirs(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.blob_store == "local":
            self.resolved_blob_dir.mkdir(parents=True, exist_ok=True)


@lru_cache
def get_settings() -> Settings:
    return Settings()
