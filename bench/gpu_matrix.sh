#!/usr/bin/env bash
# The real-model GPU matrix (bench/gpu_matrix.py) on a machine with an NVIDIA GPU and no internet.
#
#   bench/gpu_matrix.sh prepare CARRY      # here, with internet: wheels, onnxruntime-gpu in pieces, models, samples
#   bench/gpu_matrix.sh stash CARRY        # there, once per piece carried: keeps what CARRY holds in $STASH
#   bench/gpu_matrix.sh install            # there: onnxruntime-gpu and the farm's wheels into $STASH/site
#   bench/gpu_matrix.sh client             # there: the light client alone into $STASH/client-site (run measures with it)
#   bench/gpu_matrix.sh test               # there: the tests marked gpu
#   bench/gpu_matrix.sh run OUT [ARGS...]  # there: the matrix through an embedded farm (gpu_matrix.py run ARGS)
#
# What one transfer may carry is limited (64 MiB here), so onnxruntime-gpu (a 256 MB wheel) travels as an xz tar of
# its unpacked files (195 MiB) cut into pieces of PIECE_MB; each transfer stashes what it brought.
# The GPU machine is expected to have Python 3.12, numpy, onnx, torch and torchvision (for exporting the models
# with random weights) and an NVIDIA driver; everything else of the farm's comes as wheels.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
STASH="${STASH:-/tmp/gpu-carry}"
PY="${PYTHON:-python3}"
ORT_GPU="${ORT_GPU:-onnxruntime-gpu==1.31.1}"
PIECE_MB="${PIECE_MB:-54}"
# The farm's own dependencies (pyproject.toml: base, server and worker extras) and pytest for the gpu tests.
FARM_DEPS=(pydantic pydantic-settings typer rich fastapi fastapi-offline uvicorn httptools uvloop python-multipart
           "celery[sqlalchemy]" kombu sqlalchemy alembic orjson prometheus-client jinja2 tenacity filelock onnxslim
           httpx nvidia-ml-py boto3 pytest pytest-timeout)
# Large packages a CUDA machine with torch already has: carrying them would only cost transfers.
SKIP='^(numpy|onnx|sympy|mpmath|protobuf|ml_dtypes)-'

wheels_for_gpu_machine() {  # DEST: cp312 manylinux wheels of the farm's dependencies and of the farm itself
    local dest="$1" all
    all="$(mktemp -d)"
    "$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
        -d "$all" "${FARM_DEPS[@]}"
    mkdir -p "$dest"
    for w in "$all"/*.whl; do basename "$w" | grep -Eq "$SKIP" || cp "$w" "$dest/"; done
    "$PY" -m pip wheel -q --no-deps -w "$dest" "$here"
    rm -rf "$all"
}

ort_pieces() {  # DEST: onnxruntime-gpu as xz pieces plus their sha256
    local dest="$1" tmp
    tmp="$(mktemp -d)"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d "$tmp" "$ORT_GPU"
    mkdir -p "$tmp/unpacked" "$dest"
    (cd "$tmp/unpacked" && unzip -q "$tmp"/*.whl && rm -f onnxruntime/capi/libonnxruntime_providers_tensorrt.so)
    tar -C "$tmp/unpacked" -cf - . | xz -6 -T0 > "$tmp/ort.tar.xz"
    (cd "$tmp" && sha256sum ort.tar.xz > "$dest/ort.tar.xz.sha256")
    split -b "${PIECE_MB}M" -d "$tmp/ort.tar.xz" "$dest/ort.tar.xz.part"
    rm -rf "$tmp"
}

case "${1:-}" in
prepare)
    carry="$(realpath -m "${2:?CARRY folder}")"  # absolute: ort_pieces writes from inside a temp dir
    wheels_for_gpu_machine "$carry/wheels"
    ort_pieces "$carry/ort"
    (cd "$here" && "$PY" bench/gpu_matrix.py prepare "$carry/models")
    du -sh "$carry"/* ;;
stash)
    carry="${2:?CARRY folder}"
    mkdir -p "$STASH"
    for d in wheels ort models; do
        [ -d "$carry/$d" ] && mkdir -p "$STASH/$d" && cp -r "$carry/$d/." "$STASH/$d/"
    done
    du -sh "$STASH"/* ;;
install)
    (cd "$STASH/ort" && cat ort.tar.xz.part* > ../ort.tar.xz && cd .. && sha256sum -c ort/ort.tar.xz.sha256)
    rm -rf "$STASH/site" && mkdir -p "$STASH/site"
    tar -C "$STASH/site" -xJf "$STASH/ort.tar.xz"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STASH/site" \
        "$STASH"/wheels/*.whl
    PYTHONPATH="$STASH/site" "$PY" -c "import onnxruntime as o; o.preload_dlls(); print('onnxruntime', o.__version__, o.get_available_providers())" ;;
client)
    # The light client alone, as a deploy machine installs it: enginefarm with its base dependencies (no server, no
    # worker) and onnxruntime-gpu, in a site of its own; `run` measures with it (ENGINEFARM_CLIENT_SITE).
    rm -rf "$STASH/client-site" && mkdir -p "$STASH/client-site"
    tar -C "$STASH/client-site" -xJf "$STASH/ort.tar.xz"
    "$PY" -m pip install -q --no-index --find-links "$STASH/wheels" --no-compile --no-cache-dir \
        --target "$STASH/client-site" enginefarm
    ls "$STASH/client-site" ;;
test)
    # From outside the checkout, so that `enginefarm` is the installed package (whose worker is the
    # checkout's worker/ folder), and without tests/conftest.py, whose services (PostgreSQL, Redis) are not there.
    cd "$STASH"
    PYTHONPATH="$STASH/site:$here" "$PY" -m pytest -q -c /dev/null --rootdir "$here" --noconftest -p tests.gpumark \
        --gpu -m gpu "$here/tests/e2e/worker/test_ort_cuda_gpu.py" "${@:2}" ;;
run)
    out="$(realpath -m "${2:?OUT folder}")"
    cd "$STASH"
    client=""
    [ -d "$STASH/client-site" ] && client="$STASH/client-site"
    ENGINEFARM_CLIENT_SITE="$client" PATH="$STASH/site/bin:$PATH" PYTHONPATH="$STASH/site" "$PY" \
        "$here/bench/gpu_matrix.py" run "$STASH/models" --out "$out" "${@:3}" ;;
*)
    sed -n '2,10p' "$0"; exit 2 ;;
esac
