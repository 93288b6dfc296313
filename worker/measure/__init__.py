"""Measuring an engine: the runners, CUDA timing, and the benchmark and accuracy stage."""
