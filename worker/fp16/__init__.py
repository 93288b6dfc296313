"""The fp16 accuracy repair stage: the nodes to keep in fp32 so that an fp16 engine passes its gate, measured."""
