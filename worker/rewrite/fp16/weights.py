"""Initializer data for the fp16 conversion: float32 weights read inline or from external data in chunks,
converted to fp16 where their readers are fp16, and streamed to the output's own data file.

Weights stored as external data (models over 2 GB) are streamed in chunks into a new data file beside the
output, converted or copied as they are: memory holds a chunk, not the weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from enginefarm.core.errors import BuildFailed
from worker.rewrite.onnxgraph import all_graphs, attribute_tensors

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
FP16_MAX = float(np.finfo(np.float16).max)  # 65504
_ALIGN = 64
# Elements per chunk when reading or converting weights (16 MiB of float32).
_CHUNK = 1 << 22


class TensorReader:
    """Reads tensor data, from the proto or from external data files under the model's directory,
    in chunks, so a large weight never has to be in memory whole (nor several copies of it)."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir.resolve()

    def location(self, tensor: TensorProto) -> tuple[Path, int, int | None]:
        info = ExternalDataInfo(tensor)
        path = (self.base_dir / info.location).resolve()
        if not path.is_relative_to(self.base_dir):
            raise BuildFailed(f"external data of {tensor.name!r} lies outside the model's directory")
        return path, int(info.offset or 0), (int(info.length) if info.length else None)

    def flat(self, tensor: TensorProto) -> np.ndarray:
        """The tensor's values as a 1-D array: a read-only memory map for external data."""
        if not uses_external_data(tensor):
            return np.ravel(numpy_helper.to_array(tensor))
        path, offset, length = self.location(tensor)
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        count = int(np.prod(tensor.dims, dtype=np.int64))
        if length is not None and length != count * dtype.itemsize:
            raise BuildFailed(
                f"external data of {tensor.name!r} has {length} bytes, its shape needs {count * dtype.itemsize}"
            )
        if count == 0:
            return np.zeros(0, dtype)
        return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))

    def chunks(self, tensor: TensorProto) -> Iterator[np.ndarray]:
        flat = self.flat(tensor)
        for start in range(0, flat.size, _CHUNK):
            yield np.array(flat[start : start + _CHUNK])
        del flat

    def raw_chunks(self, tensor: TensorProto) -> Iterator[bytes]:
        for chunk in self.chunks(tensor):
            yield chunk.tobytes()

    def fp16_chunks(self, tensor: TensorProto) -> Iterator[bytes]:
        """The float32 tensor converted to fp16, saturating at +-65504 like the converter does."""
        from onnxruntime.transformers.float16 import convert_np_to_float16

        for chunk in self.chunks(tensor):
            # Always 1-D: the library's clamping indexes with np.where, which numpy 2 refuses on 0-d arrays.
            yield convert_np_to_float16(chunk.astype(np.float32), 5.96e-08, FP16_MAX).tobytes()


def write_initializers(
    model: ModelProto, fp16_inits: set[str], reader: TensorReader, out_dir: Path, data_name: str | None
) -> tuple[int, int]:
    """Convert the fp16-bound initializers; with external data, stream every external tensor to ``data_name``.

    Returns the numbers of main-graph float initializers made fp16 and kept float32.
    """
    # Constant tensors of the main graph are rewritten by the converter in memory: load them.
    for node in model.graph.node:
        for tensor in attribute_tensors(node):
            if uses_external_data(tensor):
                _set_raw(tensor, b"".join(reader.raw_chunks(tensor)), tensor.data_type)
    n_fp16 = n_fp32 = 0
    fh = open(out_dir / data_name, "wb") if data_name is not None else None  # noqa: SIM115 - closed below
    try:
        for tensor in model.graph.initializer:
            convert = tensor.name in fp16_inits
            n_fp16 += convert
            n_fp32 += not convert and tensor.data_type == FLOAT
            if fh is not None and data_name is not None and uses_external_data(tensor):
                # Straight from the source file to the new one, never whole in memory (nor in the proto).
                _append(
                    fh,
                    tensor,
                    data_name,
                    reader.fp16_chunks(tensor) if convert else reader.raw_chunks(tensor),
                    FLOAT16 if convert else tensor.data_type,
                )
            elif convert:
                _set_raw(tensor, b"".join(reader.fp16_chunks(tensor)), FLOAT16)
        # Subgraph tensors still on disk are copied as they are.
        for graph in list(all_graphs(model.graph))[1:]:
            for tensor in [*graph.initializer, *(t for n in graph.node for t in attribute_tensors(n))]:
                if fh is not None and data_name is not None and uses_external_data(tensor):
                    _append(fh, tensor, data_name, reader.raw_chunks(tensor), tensor.data_type)
    finally:
        if fh is not None:
            fh.close()
    return n_fp16, n_fp32


def convert_initializers_in_memory(model: ModelProto, fp16_inits: set[str], reader: TensorReader) -> tuple[int, int]:
    """Make the named initializers fp16 in the proto; returns the numbers of float initializers made fp16 and kept."""
    n_fp16 = n_fp32 = 0
    for tensor in model.graph.initializer:
        if tensor.name in fp16_inits:
            _set_raw(tensor, b"".join(reader.fp16_chunks(tensor)), FLOAT16)
            n_fp16 += 1
        elif tensor.data_type == FLOAT:
            n_fp32 += 1
    return n_fp16, n_fp32


def _append(fh, tensor: TensorProto, data_name: str, chunks: Iterable[bytes], data_type: int) -> None:
    """Write ``chunks`` at the end of the open data file and point ``tensor`` (now ``data_type``) at them."""
    pad = (-fh.tell()) % _ALIGN
    fh.write(b"\0" * pad)
    offset = fh.tell()
    for chunk in chunks:
        fh.write(chunk)
    length = fh.tell() - offset
    _clear_data(tensor)
    for key, value in (("location", data_name), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    tensor.data_location = TensorProto.EXTERNAL
    tensor.data_type = data_type


def _set_raw(tensor: TensorProto, raw: bytes, data_type: int) -> None:
    _clear_data(tensor)
    tensor.data_location = TensorProto.DEFAULT
    tensor.data_type = data_type
    tensor.raw_data = raw


def _clear_data(tensor: TensorProto) -> None:
    for name in ("float_data", "int32_data", "raw_data"):
        tensor.ClearField(name)
    del tensor.external_data[:]


def free_file_name(out_path: Path, taken: set[Path]) -> str:
    """A data file name beside ``out_path`` that is none of the source's external data files."""
    name, i = f"{out_path.name}.data", 1
    while (out_path.parent / name).resolve() in taken:
        name, i = f"{out_path.name}.{i}.data", i + 1
    return name
