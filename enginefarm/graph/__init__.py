"""ONNX model handling shared by the API and the workers: inspection, graph facts, inputs, samples, accuracy."""
