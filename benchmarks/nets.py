"""MobileNetV2 and ResNet-18 as plain torch.nn modules, for `make model-bench`.

Both follow their papers' layer tables (MobileNetV2: Sandler et al. 2018, table 2, width 1.0;
ResNet-18: He et al. 2016, table 1, basic blocks [2, 2, 2, 2]) and have the same layer shapes as
torchvision's definitions, so the benchmark needs only torch (torchvision's PyPI wheels do not
load against the CPU build of torch this project installs). Weights are random, seeded: nothing
is downloaded.
"""
from __future__ import annotations

from pathlib import Path

# MobileNetV2 inverted-residual stages: (expansion t, output channels c, repeats n, first stride s)
MOBILENET_V2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
MOBILENET_V2_STEM_CHANNELS = 32
MOBILENET_V2_HEAD_CHANNELS = 1280
# ResNet-18: (output channels, basic blocks, first stride) per stage
RESNET18_STAGES = ((64, 2, 1), (128, 2, 2), (256, 2, 2), (512, 2, 2))
RESNET_STEM_CHANNELS = 64
CLASSES = 1000
ARCHS = ("mobilenet_v2", "resnet18")


def _modules():
    import torch
    from torch import nn

    def conv_bn(c_in, c_out, kernel, stride, groups=1, act=nn.ReLU6):
        layers = [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(c_out)]
        if act is not None:
            layers.append(act(inplace=True))
        return nn.Sequential(*layers)

    class InvertedResidual(nn.Module):
        def __init__(self, c_in, c_out, stride, expand):
            super().__init__()
            hidden = c_in * expand
            layers = [conv_bn(c_in, hidden, 1, 1)] if expand != 1 else []
            layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden), conv_bn(hidden, c_out, 1, 1, act=None)]
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and c_in == c_out

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            layers = [conv_bn(3, MOBILENET_V2_STEM_CHANNELS, 3, 2)]
            c_in = MOBILENET_V2_STEM_CHANNELS
            for expand, c_out, repeats, stride in MOBILENET_V2_STAGES:
                for i in range(repeats):
                    layers.append(InvertedResidual(c_in, c_out, stride if i == 0 else 1, expand))
                    c_in = c_out
            layers.append(conv_bn(c_in, MOBILENET_V2_HEAD_CHANNELS, 1, 1))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(MOBILENET_V2_HEAD_CHANNELS, CLASSES)

        def forward(self, x):
            x = self.features(x)
            return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    class BasicBlock(nn.Module):
        def __init__(self, c_in, c_out, stride):
            super().__init__()
            self.a = conv_bn(c_in, c_out, 3, stride, act=nn.ReLU)
            self.b = conv_bn(c_out, c_out, 3, 1, act=None)
            self.shortcut = (conv_bn(c_in, c_out, 1, stride, act=None)
                             if stride != 1 or c_in != c_out else nn.Identity())

        def forward(self, x):
            return torch.relu(self.b(self.a(x)) + self.shortcut(x))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            layers = [nn.Conv2d(3, RESNET_STEM_CHANNELS, 7, 2, 3, bias=False), nn.BatchNorm2d(RESNET_STEM_CHANNELS),
                      nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
            c_in = RESNET_STEM_CHANNELS
            for c_out, blocks, stride in RESNET18_STAGES:
                for i in range(blocks):
                    layers.append(BasicBlock(c_in, c_out, stride if i == 0 else 1))
                    c_in = c_out
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(c_in, CLASSES)

        def forward(self, x):
            x = self.features(x)
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return {"mobilenet_v2": MobileNetV2, "resnet18": ResNet18}


def export(arch: str, path: Path, size: int, seed: int = 0) -> None:
    """Build `arch` with seeded random weights (eval mode) and export it to ONNX (opset 17)."""
    import torch
    torch.manual_seed(seed)
    model = _modules()[arch]().eval()
    example = torch.randn(1, 3, size, size)
    kwargs = dict(opset_version=17, input_names=["input"], output_names=["logits"])
    try:   # the TorchScript exporter: plain ONNX ops, no onnxscript needed
        torch.onnx.export(model, (example,), str(path), dynamo=False, **kwargs)
    except TypeError:   # torch without the dynamo switch
        torch.onnx.export(model, (example,), str(path), **kwargs)
