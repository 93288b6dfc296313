"""enginefarm: a self-hosted build farm for NVIDIA TensorRT engines."""

__version__ = "0.1.0"
