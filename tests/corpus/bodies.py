"""Bodies that try to make the API hold memory or disk, or answer 5xx: too many or too large form
fields, unbounded chunked bodies, lying sample headers."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Iterator

import numpy as np

from tests.corpus import E, Entry, Request, samples
from tests.corpus import files as f
from tests.helpers import UPLOAD_LIMIT

_BOUNDARY = "b0diesB0undary"


def form_upload(**extra: str) -> Callable:
    """A model upload whose form carries ``extra`` fields besides its name and file."""
    return lambda ctx: Request(
        "POST", "/v1/models", {"data": {"name": ctx.name(), **extra}, "files": {"file": ("m.onnx", f.valid_onnx())}}
    )


def chunked_upload(file_bytes: int) -> Callable:
    """A model upload sent chunked (no Content-Length) whose file part holds ``file_bytes`` bytes."""

    def body(name: str) -> Iterator[bytes]:
        yield (
            f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\n\r\n{name}\r\n'
            f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="m.onnx"\r\n\r\n'
        ).encode()
        left = file_bytes
        while left > 0:
            yield b"\0" * min(left, 1 << 20)
            left -= 1 << 20
        yield f"\r\n--{_BOUNDARY}--\r\n".encode()

    return lambda ctx: Request(
        "POST",
        "/v1/models",
        {"content": body(ctx.name()), "headers": {"content-type": f"multipart/form-data; boundary={_BOUNDARY}"}},
    )


def long_part_header(size: int) -> Callable:
    body = (
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\nX-Pad: {"p" * size}\r\n\r\nm\r\n'
        f"--{_BOUNDARY}--\r\n"
    ).encode()
    return lambda ctx: Request(
        "POST",
        "/v1/models",
        {"content": body, "headers": {"content-type": f"multipart/form-data; boundary={_BOUNDARY}"}},
    )


def npz_claiming_shape(shape: tuple[int, ...], dtype: str = "<f4", name: str = "input") -> bytes:
    """An .npz whose one array's .npy header claims ``shape`` while a few bytes follow it."""
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": dtype, "fortran_order": False, "shape": shape})
    member.write(b"\0" * 64)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr(f"{name}.npy", member.getvalue())
    return out.getvalue()


ENTRIES: list[Entry] = [
    E(
        "form-33-fields",
        "bodies",
        form_upload(**{f"f{i}": "x" for i in range(33)}),
        413,
        "more than 32 fields besides the file (ENGINEFARM_MAX_FORM_FIELDS)",
    ),
    E(
        "form-fields-300k-together",
        "bodies",
        form_upload(**{f"f{i}": "x" * 60_000 for i in range(5)}),
        413,
        "over 262144 bytes together (ENGINEFARM_MAX_FORM_BYTES)",
    ),
    E(
        "chunked-file-past-upload-limit",
        "bodies",
        chunked_upload(UPLOAD_LIMIT + (64 << 10)),
        413,
        f"larger than the limit of {UPLOAD_LIMIT} bytes (ENGINEFARM_MAX_UPLOAD_BYTES)",
    ),
    E("part-header-line-5k", "bodies", long_part_header(5000), 413, "a part's headers are over the limit"),
    E(
        "samples-npy-header-claims-12tib",
        "bodies",
        samples(lambda ctx: npz_claiming_shape((1 << 30, 3, 32, 32))),
        422,
        "array 'input' claims shape [1073741824, 3, 32, 32] of float32: 13194139533312 bytes",
    ),
]
