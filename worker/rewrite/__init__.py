"""Rewrites of a model's ONNX graph that builds and stages share: the fp16 conversion, and the graph helpers
behind it and the int8 quantization."""
