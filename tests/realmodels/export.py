"""Export the corpus's torch-built models to ONNX: ``python export.py NAME OUT``.

Run as a subprocess by ``tests.realmodels.path`` so that torch is never imported into a test
process. The architectures are the real ones from ``transformers``; the weights are random
(seeded), since no model hub is reachable. The text of this file is part of the cache key of
what it exports, so changing a recipe here makes a new cache entry.
"""

from __future__ import annotations

import sys

import torch

# The configuration of BERT-Tiny (L=2, H=128, A=2), with BERT's uncased WordPiece vocabulary size.
BERT = dict(
    vocab_size=30522,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=512,
    max_position_embeddings=512,
    type_vocab_size=2,
)
MOBILENET_V2 = dict(num_channels=3, image_size=224, depth_multiplier=1.0, num_labels=1000)


class _Bert(torch.nn.Module):
    """BertModel with a positional forward, as exporters and inference servers call it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out.last_hidden_state, out.pooler_output


class _Logits(torch.nn.Module):
    """An image classifier that returns its logits tensor instead of a ModelOutput."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits


def bert_model() -> torch.nn.Module:
    """BERT-Tiny's encoder with the corpus's random weights (torch seeded first), as exported."""
    from transformers import BertConfig, BertModel

    return _Bert(BertModel(BertConfig(**BERT))).eval()


def bert(out: str) -> None:
    """BERT encoder, int64 token inputs; batch and sequence dims symbolic and shared by all three inputs."""
    model = bert_model()
    ids = torch.randint(0, BERT["vocab_size"], (2, 16), dtype=torch.int64)
    args = (ids, torch.ones_like(ids), torch.zeros_like(ids))
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", max=BERT["max_position_embeddings"])
    dims = {0: batch, 1: seq}
    torch.onnx.export(
        model,
        args,
        out,
        dynamo=True,
        opset_version=17,
        external_data=False,
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state", "pooler_output"],
        dynamic_shapes=(dims, dims, dims),
    )


def mobilenet_v2_model() -> torch.nn.Module:
    """MobileNetV2 1.0/224 with the corpus's random weights (torch seeded first), as exported."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    model = _Logits(MobileNetV2ForImageClassification(MobileNetV2Config(**MOBILENET_V2))).eval()
    # The library's default init (normal, std 0.02) shrinks activations layer by layer to ~1e-21 logits, which
    # no precision can be judged on. He init over each filter's inputs (fan_in: 9 for a depthwise 3x3) keeps them alive.
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, mode="fan_in")
        elif isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, 0, 0.01)
    return model


def mobilenet_v2(out: str) -> None:
    """MobileNetV2 1.0/224 image classifier (TF "SAME" padding, ReLU6) with a dynamic batch."""
    model = mobilenet_v2_model()
    x = torch.rand(2, 3, 224, 224)
    # opset 18, torch's own: converting this graph down to 17 fails ("No Adapter To Version $17 for Pad").
    torch.onnx.export(
        model,
        (x,),
        out,
        dynamo=True,
        opset_version=18,
        external_data=False,
        input_names=["pixel_values"],
        output_names=["logits"],
        dynamic_shapes=({0: torch.export.Dim("batch", max=64)},),
    )


RECIPES = {"bert": bert, "mobilenet-v2": mobilenet_v2}


if __name__ == "__main__":
    name, target = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with torch.no_grad():
        RECIPES[name](target)
