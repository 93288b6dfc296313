"""The part of Triton's ``inference.ModelConfig`` that ``enginefarm.triton`` emits, built in code.

Field names and numbers follow Triton's model_config.proto (triton-inference-server/common,
protobuf/model_config.proto). Only the fields we write are declared, so parsing a generated
config.pbtxt with ``text_format.Parse`` fails on any field Triton would not know by that name.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto
PACKAGE = "inference"

DATA_TYPES = [
    "TYPE_INVALID",
    "TYPE_BOOL",
    "TYPE_UINT8",
    "TYPE_UINT16",
    "TYPE_UINT32",
    "TYPE_UINT64",
    "TYPE_INT8",
    "TYPE_INT16",
    "TYPE_INT32",
    "TYPE_INT64",
    "TYPE_FP16",
    "TYPE_FP32",
    "TYPE_FP64",
    "TYPE_STRING",
    "TYPE_BF16",
]
KINDS = ["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"]
FORMATS = ["FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"]


def _enum(parent, name: str, values: list[str]) -> None:
    enum = parent.enum_type.add(name=name)
    for number, value in enumerate(values):
        enum.value.add(name=value, number=number)


def _field(
    msg: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    ftype: int,
    type_name: str | None = None,
    repeated: bool = False,
) -> None:
    f = msg.field.add(name=name, number=number, type=ftype, label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
    if type_name:
        f.type_name = type_name


def _string_map(parent: descriptor_pb2.DescriptorProto, entry_name: str) -> None:
    """A ``map<string, string>``'s entry type, nested in ``parent``."""
    entry = parent.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    _field(entry, "key", 1, F.TYPE_STRING)
    _field(entry, "value", 2, F.TYPE_STRING)


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="enginefarm_tests/triton_model_config.proto", package=PACKAGE, syntax="proto3"
    )
    _enum(fd, "DataType", DATA_TYPES)
    dtype = ".inference.DataType"

    reshape = fd.message_type.add(name="ModelTensorReshape")
    _field(reshape, "shape", 1, F.TYPE_INT64, repeated=True)

    group = fd.message_type.add(name="ModelInstanceGroup")
    _enum(group, "Kind", KINDS)
    _field(group, "name", 1, F.TYPE_STRING)
    _field(group, "count", 2, F.TYPE_INT32)
    _field(group, "gpus", 3, F.TYPE_INT32, repeated=True)
    _field(group, "kind", 4, F.TYPE_ENUM, ".inference.ModelInstanceGroup.Kind")

    inp = fd.message_type.add(name="ModelInput")
    _enum(inp, "Format", FORMATS)
    _field(inp, "name", 1, F.TYPE_STRING)
    _field(inp, "data_type", 2, F.TYPE_ENUM, dtype)
    _field(inp, "format", 3, F.TYPE_ENUM, ".inference.ModelInput.Format")
    _field(inp, "dims", 4, F.TYPE_INT64, repeated=True)
    _field(inp, "reshape", 5, F.TYPE_MESSAGE, ".inference.ModelTensorReshape")

    out = fd.message_type.add(name="ModelOutput")
    _field(out, "name", 1, F.TYPE_STRING)
    _field(out, "data_type", 2, F.TYPE_ENUM, dtype)
    _field(out, "dims", 3, F.TYPE_INT64, repeated=True)
    _field(out, "reshape", 5, F.TYPE_MESSAGE, ".inference.ModelTensorReshape")

    batching = fd.message_type.add(name="ModelDynamicBatching")
    _field(batching, "preferred_batch_size", 1, F.TYPE_INT32, repeated=True)
    _field(batching, "max_queue_delay_microseconds", 2, F.TYPE_UINT64)

    policy = fd.message_type.add(name="ModelOptimizationPolicy")
    accelerators = policy.nested_type.add(name="ExecutionAccelerators")
    accelerator = accelerators.nested_type.add(name="Accelerator")
    _string_map(accelerator, "ParametersEntry")
    _field(accelerator, "name", 1, F.TYPE_STRING)
    accel = ".inference.ModelOptimizationPolicy.ExecutionAccelerators.Accelerator"
    _field(accelerator, "parameters", 2, F.TYPE_MESSAGE, accel + ".ParametersEntry", repeated=True)
    _field(accelerators, "gpu_execution_accelerator", 1, F.TYPE_MESSAGE, accel, repeated=True)
    _field(accelerators, "cpu_execution_accelerator", 2, F.TYPE_MESSAGE, accel, repeated=True)
    accels = ".inference.ModelOptimizationPolicy.ExecutionAccelerators"
    _field(policy, "execution_accelerators", 4, F.TYPE_MESSAGE, accels)

    config = fd.message_type.add(name="ModelConfig")
    _string_map(config, "CcModelFilenamesEntry")
    _field(config, "name", 1, F.TYPE_STRING)
    _field(config, "platform", 2, F.TYPE_STRING)
    _field(config, "max_batch_size", 4, F.TYPE_INT32)
    _field(config, "input", 5, F.TYPE_MESSAGE, ".inference.ModelInput", repeated=True)
    _field(config, "output", 6, F.TYPE_MESSAGE, ".inference.ModelOutput", repeated=True)
    _field(config, "instance_group", 7, F.TYPE_MESSAGE, ".inference.ModelInstanceGroup", repeated=True)
    _field(config, "default_model_filename", 8, F.TYPE_STRING)
    _field(
        config, "cc_model_filenames", 9, F.TYPE_MESSAGE, ".inference.ModelConfig.CcModelFilenamesEntry", repeated=True
    )
    _field(config, "dynamic_batching", 11, F.TYPE_MESSAGE, ".inference.ModelDynamicBatching")
    _field(config, "optimization", 12, F.TYPE_MESSAGE, ".inference.ModelOptimizationPolicy")
    return fd


_POOL = descriptor_pool.DescriptorPool()
_FILE = _POOL.Add(_file())
ModelConfig = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("inference.ModelConfig"))
ModelInstanceGroup = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("inference.ModelInstanceGroup"))
DataType = _POOL.FindEnumTypeByName("inference.DataType")
