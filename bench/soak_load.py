"""The soak's workload: threads that each repeat one kind of request at a steady rate against a running farm, and
the record of every request (its latency against its bound, its errors, and the failures that fell into the API's
restart window, counted apart).

Kinds: uploads (a fixed set of conv nets, and every third upload a real network nobody here wrote, PaddleOCR's
text detector or its direction classifier from tests/realmodels, uploaded again and again as new versions: catalog
rows grow, blob bytes do not), builds (CPU + a GPU target whose benchmark waits for ever; fp16, fp32, int8 from
samples, int8 with accuracy repair; every third build a real network's, at fp32 and the shapes its corpus entry
gives), each followed by a build long poll until done, resolves and their 304s and the engines' downloads (sha256
checked), the dashboard's long poll of the latest build, and tokens made, used and revoked."""

from __future__ import annotations

import hashlib
import html
import itertools
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import httpx
import numpy as np

from enginefarm.graph.samples import sample_spec, save_conv_net

CPU = "onnxruntime/cpu-x86_64"
GPUS = ["tensorrt-rtx/sm86", "tensorrt-rtx/sm89"]
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}  # the CPU benchmark, kept cheap
SEEDS = (11, 12)
REAL = ("ppocr-det", "ppocr-cls")  # real networks from the test corpus (shipped in PyPI wheels, sha256 pinned)
# (precision, accuracy_repair, GPU target): the build kinds, in turn
KINDS = [("fp16", False, GPUS[0]), ("fp32", False, GPUS[1]), ("int8", False, GPUS[0]), ("int8", True, GPUS[1])]
BATCHES = (8, 16)  # the profile's max batch: with the seeds and kinds, 16 distinct engines per target in all
MACHINES = {  # GET /v1/resolve fingerprints: a CPU server and an RTX 3090 that takes the CPU artifact if need be
    "cpu": {"platform": "x86_64"},
    "rtx3090": {
        "gpu": "NVIDIA GeForce RTX 3090",
        "cc": "8.6",
        "trt_rtx": "1.7.1.116",
        "driver": "580.82.07",
        "cuda": "13.0",
        "platform": "x86_64",
        "accept": "cpu",
    },
}
CONNECTION_ERRORS = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@dataclass
class Rates:
    """Seconds between two of each operation (per thread)."""

    upload: float = 20.0
    build: float = 30.0
    resolve: float = 1.0
    tokens: float = 20.0
    ui_wait: float = 15.0  # the long polls' wait
    build_wait: float = 20.0


@dataclass
class Bounds:
    """The longest each request kind may take (s); a long poll's is its wait plus ``margin``."""

    resolve: float = 3.0
    resolve_304: float = 2.0
    upload: float = 15.0
    download: float = 5.0
    token: float = 3.0
    submit: float = 10.0
    margin: float = 5.0
    build: float = 300.0  # submit to every task final and the CPU check done
    api_down: float = 45.0  # the API's restart: SIGTERM to /healthz answering again

    def of(self, kind: str, rates: Rates) -> float:
        if kind == "longpoll":
            return rates.build_wait + self.margin
        if kind == "ui_longpoll":
            return rates.ui_wait + self.margin
        return getattr(self, kind.removesuffix("_ui").replace("token_", "token").replace("-", "_"), 10.0)


@dataclass
class Record:
    """Every request's outcome. ``down``: the API's restart windows, (start, end) monotonic; a connection error that
    overlaps one (plus a second) is counted as ``restart_window``, not as an error."""

    rates: Rates
    bounds: Bounds
    lat: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    restart_window: int = 0
    down: list[list[float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    events: list[float] = field(default_factory=list)  # monotonic times of process restarts
    lock: threading.Lock = field(default_factory=threading.Lock)
    t0: float = field(default_factory=time.monotonic)

    def in_window(self, start: float, end: float) -> bool:
        return any(start <= (b if b else time.monotonic()) + 1.0 and end >= a - 1.0 for a, b in self.down)

    def ok(self, kind: str, start: float, end: float) -> None:
        took = end - start
        with self.lock:
            self.lat.setdefault(kind, []).append(took)
            if took > self.bounds.of(kind, self.rates) and not self.in_window(start, end):
                self.slow.append(f"{kind} took {took:.2f} s at t={start - self.t0:.0f} s")

    def error(self, kind: str, start: float, what: str, exc: BaseException | None = None) -> None:
        end = time.monotonic()
        with self.lock:
            if isinstance(exc, CONNECTION_ERRORS) and self.in_window(start, end):
                self.restart_window += 1
            else:
                self.errors.append(f"{kind} at t={start - self.t0:.0f} s: {what}")


class Workload:
    """The farm's clients. ``url``/``token``: the farm and an admin token; ``work``: a scratch folder."""

    def __init__(self, url: str, token: str, work: Path, rec: Record):
        self.url, self.token, self.rec, self.work = url, token, rec, work
        self.auth = {"Authorization": f"Bearer {token}"}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.models: list[dict] = []  # uploaded, newest last
        self.ready: list[tuple[str, str]] = []  # (name, version) with a built CPU engine
        self.builds: dict[int, dict] = {}  # id -> {"submitted", "kind", "done", "state", "problem"}
        self.threads: list[threading.Thread] = []
        self.waiters: list[threading.Thread] = []
        self.files = {s: save_conv_net(work / f"s{s}.onnx", seed=s) for s in SEEDS}
        from tests import realmodels  # the corpus: fetched once, then from its cache

        self.real = {name: (realmodels.path(name), realmodels.MODELS[name]) for name in REAL}
        self.samples = work / "samples.npz"
        np.savez(self.samples, input=np.random.default_rng(5).standard_normal((8, 3, 32, 32)).astype(np.float32))
        self.counter = itertools.count(1)
        self.uploaded = itertools.count(1)  # every third upload is a real network

    def http(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.auth, timeout=timeout, trust_env=False)

    def start(self) -> None:
        for name in ("uploads", "builds", "resolves", "tokens", "ui"):
            t = threading.Thread(target=self._loop, args=(name,), name=name, daemon=True)
            t.start()
            self.threads.append(t)

    def finish(self, timeout: float) -> None:
        """Stop the loops, then wait up to ``timeout`` for the builds' long polls to see their builds done."""
        self.stop.set()
        for t in self.threads:
            t.join(60)
        deadline = time.monotonic() + timeout
        for t in self.waiters:
            t.join(max(0.0, deadline - time.monotonic()))

    def _loop(self, name: str) -> None:
        r = self.rec.rates
        every = {"uploads": "upload", "builds": "build", "resolves": "resolve", "tokens": "tokens"}
        step = getattr(self, f"_{name}")
        with self.http() as http:
            while not self.stop.is_set():
                started = time.monotonic()
                if getattr(r, every.get(name, ""), 0.0) != float("inf"):  # inf: this kind has stopped
                    try:
                        step(http)
                    except Exception as exc:  # noqa: BLE001 - counted; the loop goes on
                        self.rec.error(name, started, f"{type(exc).__name__}: {exc}", exc)
                        self.stop.wait(1.0)
                pause = getattr(r, every.get(name, ""), 0.0)
                self.stop.wait(min(3600.0, max(0.0, pause - (time.monotonic() - started))))

    # ------------------------------------------------------------------ uploads and builds

    def _uploads(self, http: httpx.Client) -> None:
        i = next(self.uploaded)
        real = REAL[(i // 3) % len(REAL)] if i % 3 == 0 else None
        seed = SEEDS[i % len(SEEDS)]
        name, version = (f"soak-{real}" if real else f"soak-s{seed}"), f"v{i}"
        start = time.monotonic()
        with (self.real[real][0] if real else self.files[seed]).open("rb") as f:
            r = http.post("/v1/models", data={"name": name, "version": version}, files={"file": (f"{name}.onnx", f)})
        if r.status_code != 201:
            return self.rec.error("upload", start, f"HTTP {r.status_code} {r.text[:200]}")
        self.rec.ok("upload", start, time.monotonic())
        with self.lock:
            self.models.append(r.json() | {"real": real})

    def _builds(self, http: httpx.Client) -> None:
        if not self.models:
            self._uploads(http)
        with self.lock:
            n = len(self.builds)
            real = [m for m in self.models if m["real"]]
            # Every third build is of the latest real network (once one is uploaded), the others of a conv net.
            model = real[-1] if real and n % 3 == 2 else next(m for m in reversed(self.models) if not m["real"])
        precision, repair, gpu = KINDS[n % len(KINDS)]
        batch = BATCHES[(n // len(KINDS)) % len(BATCHES)]
        spec = {**sample_spec(batch=(1, 4, batch)), "precision": precision, "benchmark": QUICK}
        if model["real"]:  # its own shapes; fp32, which every target builds for it
            corpus = self.real[model["real"]][1]
            precision, repair, batch = "fp32", False, 0
            spec = {**corpus.shapes, **corpus.spec, "precision": precision, "benchmark": QUICK}
        if repair:
            spec["accuracy_repair"] = True
        if precision == "int8" and not model.get("samples"):
            start = time.monotonic()
            with self.samples.open("rb") as f:
                r = http.post(f"/v1/models/{model['id']}/samples", files={"file": ("samples.npz", f)})
            if r.status_code != 200:
                return self.rec.error("samples", start, f"HTTP {r.status_code} {r.text[:200]}")
            self.rec.ok("upload", start, time.monotonic())
        start = time.monotonic()
        r = http.post("/v1/builds", json={"model_id": model["id"], "targets": [CPU, gpu], "spec": spec})
        if r.status_code != 202:
            return self.rec.error("submit", start, f"HTTP {r.status_code} {r.text[:200]}")
        self.rec.ok("submit", start, time.monotonic())
        build = r.json()
        kind = f"{model['real']}/fp32" if model["real"] else f"{precision}{'+repair' if repair else ''}/b{batch}"
        with self.lock:
            self.builds[build["id"]] = {"submitted": start, "kind": kind, "done": False, "state": "queued"}
        t = threading.Thread(target=self._follow, args=(build["id"], model, start), daemon=True)
        t.start()
        self.waiters.append(t)

    def _follow(self, build_id: int, model: dict, submitted: float) -> None:
        """The dashboard's and the client's wait: long polls with the last ETag until the build and its CPU check
        are done, or its bound has passed."""
        wait, bound = self.rec.rates.build_wait, self.rec.bounds.build
        tag, build = None, None
        with self.http(timeout=wait + 30) as http:
            while time.monotonic() < submitted + bound:
                start = time.monotonic()
                try:
                    r = http.get(
                        f"/v1/builds/{build_id}",
                        params={"wait": wait} if tag else {},
                        headers={"If-None-Match": tag} if tag else {},
                    )
                except httpx.HTTPError as exc:
                    self.rec.error("longpoll", start, f"{type(exc).__name__}: {exc}", exc)
                    time.sleep(1.0)
                    continue
                if r.status_code not in (200, 304):
                    self.rec.error("longpoll", start, f"HTTP {r.status_code} {r.text[:200]}")
                    time.sleep(1.0)
                    continue
                self.rec.ok("longpoll" if tag else "build_get", start, time.monotonic())
                if r.status_code == 200:
                    build, tag = r.json(), r.headers.get("etag")
                    if self._settled(build):
                        break
        self._judge_build(build_id, build, model, submitted)

    @staticmethod
    def _settled(build: dict) -> bool:
        final = {"succeeded", "failed", "cancelled"}
        if any(t["state"] not in final for t in build["tasks"]):
            return False
        cpu = [t for t in build["tasks"] if t["target"] == CPU]
        return all(t["check"] and t["check"]["state"] in final for t in cpu if t["state"] == "succeeded")

    def _judge_build(self, build_id: int, build: dict | None, model: dict, submitted: float) -> None:
        problem = None
        if build is None or not self._settled(build):
            states = [
                (t["target"], t["state"], (t["check"] or {}).get("state")) for t in (build or {}).get("tasks", [])
            ]
            problem = f"not finished within {self.rec.bounds.build:.0f} s: {states}"
        else:
            for t in build["tasks"]:
                check = t["check"] or {}
                if t["state"] != "succeeded":
                    problem = f"task {t['id']} {t['target']} {t['state']}: {t['error']}"
                elif t["target"] == CPU and check.get("state") != "succeeded":
                    problem = f"CPU check of task {t['id']}: {check}"
                elif t["target"] != CPU and check.get("state") in ("failed", "cancelled", "succeeded"):
                    problem = f"GPU check of task {t['id']} should wait for a GPU: {check}"
            if build.get("quantize") and build["quantize"].get("state") not in (None, "succeeded"):
                problem = f"quantize stage {build['quantize'].get('state')}: {build['quantize'].get('error')}"
        with self.lock:
            info = self.builds[build_id]
            info.update(done=problem is None, took=time.monotonic() - submitted, problem=problem)
            info["state"] = "ok" if problem is None else "problem"
            if problem is None:
                self.ready.append((model["name"], model["version"]))
        if problem:
            self.rec.error("build", submitted, f"build {build_id} ({info['kind']}): {problem}")

    # ------------------------------------------------------------------ resolves and downloads

    def _resolves(self, http: httpx.Client) -> None:
        with self.lock:
            if not self.ready:
                return
            name, version = self.ready[next(self.counter) % len(self.ready)]
        for machine, fp in MACHINES.items():
            path = "/v1/resolve?" + urlencode({"model": name, "version": version, **fp})
            start = time.monotonic()
            r = http.get(path)
            if r.status_code != 200:
                self.rec.error("resolve", start, f"{machine} {name}:{version} HTTP {r.status_code} {r.text[:200]}")
                continue
            self.rec.ok("resolve", start, time.monotonic())
            engine, tag = r.json()["engine"], r.headers["etag"]
            start = time.monotonic()
            again = http.get(path, headers={"If-None-Match": tag})
            if again.status_code != 304:  # a new engine or check of this version may change the answer: a 200
                if again.status_code != 200:
                    self.rec.error("resolve_304", start, f"HTTP {again.status_code} {again.text[:200]}")
                    continue
                self.rec.notes.append(f"conditional resolve answered 200 at t={start - self.rec.t0:.0f} s")
            self.rec.ok("resolve_304" if again.status_code == 304 else "resolve", start, time.monotonic())
            start = time.monotonic()
            digest, n = hashlib.sha256(), 0
            with http.stream("GET", f"/v1/engines/{engine['id']}/content", follow_redirects=True) as d:
                if d.status_code != 200:
                    d.read()
                    self.rec.error("download", start, f"engine {engine['id']} HTTP {d.status_code}")
                    continue
                for chunk in d.iter_raw(1 << 20):
                    digest.update(chunk)
                    n += len(chunk)
            if digest.hexdigest() != engine["sha256"] or n != engine["size"]:
                self.rec.error("download", start, f"engine {engine['id']}: sha256/size differ from the catalog's")
                continue
            self.rec.ok("download", start, time.monotonic())

    # ------------------------------------------------------------------ tokens

    def _tokens(self, http: httpx.Client) -> None:
        start = time.monotonic()
        r = http.post("/v1/tokens", json={"name": f"soak-{next(self.counter)}", "scopes": ["read"]})
        if r.status_code != 201:
            return self.rec.error("token", start, f"create: HTTP {r.status_code} {r.text[:200]}")
        self.rec.ok("token", start, time.monotonic())
        made = r.json()
        own = {"Authorization": f"Bearer {made['token']}"}
        start = time.monotonic()
        r = http.get("/v1/tokens/current", headers=own)
        if r.status_code != 200:
            return self.rec.error("token", start, f"use: HTTP {r.status_code} {r.text[:200]}")
        self.rec.ok("token", start, time.monotonic())
        start = time.monotonic()
        r = http.delete(f"/v1/tokens/{made['id']}")
        if r.status_code != 200:
            return self.rec.error("token", start, f"revoke: HTTP {r.status_code} {r.text[:200]}")
        self.rec.ok("token", start, time.monotonic())
        start = time.monotonic()
        r = http.get("/v1/tokens/current", headers=own)
        if r.status_code != 401:
            return self.rec.error("token", start, f"revoked token answered HTTP {r.status_code}, not 401")
        self.rec.ok("token", start, time.monotonic())

    # ------------------------------------------------------------------ the dashboard's long poll

    def _ui(self, http: httpx.Client) -> None:
        """Sign in (once per cookie jar), then long-poll the newest build's tasks fragment with the tag it shows."""
        with self.lock:
            build_id = max(self.builds) if self.builds else None
        if build_id is None:
            self.stop.wait(2.0)
            return
        if "ef_session" not in http.cookies and not self._sign_in(http):
            self.stop.wait(5.0)
            return
        wait = self.rec.rates.ui_wait
        start = time.monotonic()
        r = http.get(f"/ui/builds/{build_id}/tasks", timeout=wait + 30)
        if r.status_code != 200:
            return self.rec.error("ui", start, f"HTTP {r.status_code} {r.text[:200]}")
        seen = re.search(r'data-tag="([^"]*)"', r.text)
        if not seen:
            return self.rec.error("ui", start, "the tasks fragment shows no tag")
        start = time.monotonic()
        r = http.get(
            f"/ui/builds/{build_id}/tasks",
            params={"wait": wait, "seen": html.unescape(seen.group(1))},
            timeout=wait + 30,
        )
        if r.status_code not in (200, 204, 286, 304):
            return self.rec.error("ui_longpoll", start, f"HTTP {r.status_code} {r.text[:200]}")
        self.rec.ok("ui_longpoll", start, time.monotonic())

    def _sign_in(self, http: httpx.Client) -> bool:
        start = time.monotonic()
        form = http.get("/ui/signin")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        if form.status_code != 200 or not csrf:
            self.rec.error("ui", start, f"sign-in form: HTTP {form.status_code}")
            return False
        r = http.post("/ui/signin", data={"token": self.token, "csrf": csrf.group(1), "next": "/ui/models"})
        if r.status_code != 303:
            self.rec.error("ui", start, f"sign-in: HTTP {r.status_code} {r.text[:200]}")
            return False
        self.rec.ok("token", start, time.monotonic())
        return True
