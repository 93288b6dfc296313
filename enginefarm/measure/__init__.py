"""Running an engine and timing it by the farm's trtexec rules: ONNX Runtime on the CPU (``ort_runner``), ONNX Runtime's
CUDA provider (``ort_cuda_runner``) and the TensorRT and TensorRT-RTX runtimes (``trt_runner``) through the CUDA
driver (``cuda_driver``, ``gpu_timing``). The farm's workers benchmark with these, and so does a deploy machine
(``enginefarm measure``, ``cli``), so the fleet's figures and the farm's are made by one code. Each runtime comes
from an extra (``enginefarm[measure-ort]``, ``enginefarm[measure-cuda]``, ``enginefarm[measure-rtx]``) and is imported
only when used."""
