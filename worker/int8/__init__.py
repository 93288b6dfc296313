"""The int8 stage: quantize a model from its samples, choose the fastest form that passes, repair one that fails."""
