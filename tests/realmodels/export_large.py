"""Export the int8 benchmark's larger networks to ONNX (random weights): ``python export_large.py NAME OUT``.

ResNet-50 as torchvision defines it, exported as the TensorRT tutorials do (dynamic batch, opset 17); ConvNeXt-Tiny
as timm defines it; a GPT-2 style decoder from ``transformers``. The two vision networks are written out layer for
layer here because torchvision (and so timm) does not install beside the CPU torch build our machines carry.
Run as a subprocess by ``tests.realmodels.large`` so that torch is never imported into a test process.
"""

from __future__ import annotations

import sys

import torch
from torch import nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """torchvision's resnet50 layer for layer."""

    def __init__(self, layers=(3, 4, 6, 3), num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make(64, layers[0])
        self.layer2 = self._make(128, layers[1], 2)
        self.layer3 = self._make(256, layers[2], 2)
        self.layer4 = self._make(512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make(self, planes, blocks, stride=1):
        down = None
        if stride != 1 or self.inplanes != planes * 4:
            down = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * 4, 1, stride, bias=False), nn.BatchNorm2d(planes * 4)
            )
        layers = [Bottleneck(self.inplanes, planes, stride, down)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """timm's ConvNeXtBlock (conv_mlp=False): depthwise 7x7, channels-last LayerNorm, Linear-GELU-Linear, layer
    scale."""

    def __init__(self, dim):
        super().__init__()
        self.conv_dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-1))

    def forward(self, x):
        shortcut = x
        x = self.conv_dw(x).permute(0, 2, 3, 1)
        x = self.fc2(self.act(self.fc1(self.norm(x)))) * self.gamma
        return x.permute(0, 3, 1, 2) + shortcut


class ConvNeXtTiny(nn.Module):
    """timm's convnext_tiny: depths (3, 3, 9, 3), dims (96, 192, 384, 768)."""

    def __init__(self, depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6))
        stages = []
        for i, (depth, dim) in enumerate(zip(depths, dims)):
            down = (
                nn.Identity()
                if i == 0
                else nn.Sequential(LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2))
            )
            stages.append(nn.Sequential(down, *[ConvNeXtBlock(dim) for _ in range(depth)]))
        self.stages = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(self.norm(x.mean((2, 3))))


def _settle_batchnorm(model, shape):
    """Running statistics from a few batches in training mode, so activations stay in a realistic range."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(*shape))
    model.eval()


def resnet50(out):
    model = ResNet50()
    _settle_batchnorm(model, (4, 3, 224, 224))
    torch.onnx.export(
        model,
        (torch.rand(1, 3, 224, 224),),
        out,
        dynamo=True,
        opset_version=17,
        external_data=False,
        input_names=["input"],
        output_names=["output"],
        dynamic_shapes=({0: torch.export.Dim("batch", max=64)},),
    )


def convnext(out):
    model = ConvNeXtTiny().eval()
    torch.onnx.export(
        model,
        (torch.rand(2, 3, 224, 224),),
        out,
        dynamo=True,
        opset_version=17,
        external_data=False,
        input_names=["input"],
        output_names=["logits"],
        dynamic_shapes=({0: torch.export.Dim("batch", max=64)},),
    )


class _Decoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def gpt2(out):
    from transformers import GPT2Config, GPT2Model

    model = _Decoder(GPT2Model(GPT2Config(vocab_size=8192, n_positions=256, n_embd=128, n_layer=4, n_head=4))).eval()
    ids = torch.randint(0, 8192, (2, 16))
    # opset 18: the exporter writes Split with num_outputs, which opset 17 does not have.
    torch.onnx.export(
        model,
        (ids,),
        out,
        dynamo=True,
        opset_version=18,
        external_data=False,
        input_names=["input_ids"],
        output_names=["hidden"],
        dynamic_shapes=({0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("sequence", max=256)},),
    )


RECIPES = {"resnet50": resnet50, "convnext": convnext, "gpt2": gpt2}

if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with torch.no_grad():
        RECIPES[sys.argv[1]](sys.argv[2])
