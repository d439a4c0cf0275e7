"""MobileNetV2 and ResNet-18 as plain torch.nn modules, for `make model-bench`.

Both follow their papers' layer tables (MobileNetV2: Sandler et al. 2018, table 2, width 1.0;
ResNet-18: He et al. 2016, table 1, basic blocks [2, 2, 2, 2]) and have the same layer shapes as
torchvision's definitions, so the benchmark needs only torch (torchvision's PyPI wheels do not
load against the CPU build of torch this project installs). Weights are random, seeded: nothing
is downloaded.
"""
from __future__ import annotations

import sys
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
# The other CNN families of the whole-network benchmark (benchmarks/net_bench.py, issue 32)
FAMILIES = ("mobilenet_v3", "resnet50", "shufflenet_v1", "unet")
ALL = ARCHS + FAMILIES                    # every network this module builds
# MobileNetV3-Large (Howard et al. 2019, table 1): (kernel, expansion, out, squeeze-excite, hard-swish, stride)
MOBILENET_V3_LARGE = ((3, 16, 16, False, False, 1), (3, 64, 24, False, False, 2), (3, 72, 24, False, False, 1),
                      (5, 72, 40, True, False, 2), (5, 120, 40, True, False, 1), (5, 120, 40, True, False, 1),
                      (3, 240, 80, False, True, 2), (3, 200, 80, False, True, 1), (3, 184, 80, False, True, 1),
                      (3, 184, 80, False, True, 1), (3, 480, 112, True, True, 1), (3, 672, 112, True, True, 1),
                      (5, 672, 160, True, True, 2), (5, 960, 160, True, True, 1), (5, 960, 160, True, True, 1))
RESNET50_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))   # bottleneck width, blocks, first stride
SHUFFLENET_V1_G3 = ((240, 4), (480, 8), (960, 4))                        # ShuffleNet 1x, g = 3: out channels, units
UNET_CHANNELS = (16, 32, 64, 128, 256)                                    # a small U-Net: channels per level


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

    def make_divisible(v, divisor=8):
        return max(divisor, int(v + divisor / 2) // divisor * divisor)

    class SqueezeExcite(nn.Module):
        def __init__(self, c):
            super().__init__()
            squeeze = make_divisible(c // 4)
            self.reduce, self.expand = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)

        def forward(self, x):
            s = nn.functional.adaptive_avg_pool2d(x, 1)
            return x * nn.functional.hardsigmoid(self.expand(torch.relu(self.reduce(s))))

    class V3Block(nn.Module):
        def __init__(self, c_in, kernel, hidden, c_out, se, hswish, stride):
            super().__init__()
            act = nn.Hardswish if hswish else nn.ReLU
            layers = [conv_bn(c_in, hidden, 1, 1, act=act)] if hidden != c_in else []
            layers.append(conv_bn(hidden, hidden, kernel, stride, groups=hidden, act=act))
            if se:
                layers.append(SqueezeExcite(hidden))
            layers.append(conv_bn(hidden, c_out, 1, 1, act=None))
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and c_in == c_out

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    class MobileNetV3(nn.Module):
        def __init__(self):
            super().__init__()
            layers, c_in = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)], 16
            for kernel, hidden, c_out, se, hswish, stride in MOBILENET_V3_LARGE:
                layers.append(V3Block(c_in, kernel, hidden, c_out, se, hswish, stride))
                c_in = c_out
            layers.append(conv_bn(c_in, 960, 1, 1, act=nn.Hardswish))
            self.features = nn.Sequential(*layers)
            self.head = nn.Sequential(nn.Linear(960, 1280), nn.Hardswish(), nn.Linear(1280, CLASSES))

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.head(torch.flatten(x, 1))

    class Bottleneck(nn.Module):
        def __init__(self, c_in, width, stride):
            super().__init__()
            c_out = 4 * width
            self.body = nn.Sequential(conv_bn(c_in, width, 1, 1, act=nn.ReLU), conv_bn(width, width, 3, stride, act=nn.ReLU),
                                      conv_bn(width, c_out, 1, 1, act=None))
            self.shortcut = (conv_bn(c_in, c_out, 1, stride, act=None) if stride != 1 or c_in != c_out
                             else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.shortcut(x))

    class ResNet50(nn.Module):
        def __init__(self):
            super().__init__()
            layers = [nn.Conv2d(3, RESNET_STEM_CHANNELS, 7, 2, 3, bias=False), nn.BatchNorm2d(RESNET_STEM_CHANNELS),
                      nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
            c_in = RESNET_STEM_CHANNELS
            for width, blocks, stride in RESNET50_STAGES:
                for i in range(blocks):
                    layers.append(Bottleneck(c_in, width, stride if i == 0 else 1))
                    c_in = 4 * width
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(c_in, CLASSES)

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    def shuffle(x, groups):
        n, c, h, w = x.size()
        return x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous().view(n, c, h, w)

    class ShuffleUnit(nn.Module):
        """ShuffleNet (Zhang et al. 2018) unit: grouped 1x1, shuffle, depthwise 3x3, grouped 1x1; stride 2
        concatenates a 3x3 average pool of the input."""

        def __init__(self, c_in, c_out, stride, groups, first_groups):
            super().__init__()
            self.stride, self.groups = stride, groups
            branch = c_out - c_in if stride == 2 else c_out
            mid = c_out // 4
            self.reduce = conv_bn(c_in, mid, 1, 1, groups=first_groups, act=nn.ReLU)
            self.dw = conv_bn(mid, mid, 3, stride, groups=mid, act=None)
            self.expand = conv_bn(mid, branch, 1, 1, groups=groups, act=None)

        def forward(self, x):
            y = self.expand(self.dw(shuffle(self.reduce(x), self.groups)))
            if self.stride == 2:
                return torch.relu(torch.cat([nn.functional.avg_pool2d(x, 3, 2, 1), y], 1))
            return torch.relu(x + y)

    class ShuffleNetV1(nn.Module):
        def __init__(self, groups=3):
            super().__init__()
            layers, c_in = [conv_bn(3, 24, 3, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1)], 24
            for stage, (c_out, units) in enumerate(SHUFFLENET_V1_G3):
                for i in range(units):
                    layers.append(ShuffleUnit(c_in, c_out, 2 if i == 0 else 1, groups,
                                              1 if stage == 0 and i == 0 else groups))
                    c_in = c_out
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(c_in, CLASSES)

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    def double_conv(c_in, c_out):
        return nn.Sequential(conv_bn(c_in, c_out, 3, 1, act=nn.ReLU), conv_bn(c_out, c_out, 3, 1, act=nn.ReLU))

    class UNet(nn.Module):
        """A small U-Net (Ronneberger et al. 2015) for 2-class segmentation: max-pool down, nearest x2 up,
        Concat with the skip tensors."""

        def __init__(self):
            super().__init__()
            chans = UNET_CHANNELS
            self.down = nn.ModuleList([double_conv(3, chans[0])] +
                                      [double_conv(chans[i], chans[i + 1]) for i in range(len(chans) - 1)])
            self.up = nn.ModuleList([double_conv(chans[i] + chans[i + 1], chans[i]) for i in range(len(chans) - 1)])
            self.head = nn.Conv2d(chans[0], 2, 1)

        def forward(self, x):
            skips = []
            for i, block in enumerate(self.down):
                x = block(x if i == 0 else nn.functional.max_pool2d(x, 2))
                skips.append(x)
            for i in reversed(range(len(self.up))):
                x = nn.functional.interpolate(x, scale_factor=2, mode="nearest")
                x = self.up[i](torch.cat([skips[i], x], 1))
            return self.head(x)

    return {"mobilenet_v2": MobileNetV2, "resnet18": ResNet18, "mobilenet_v3": MobileNetV3, "resnet50": ResNet50,
            "shufflenet_v1": ShuffleNetV1, "unet": UNet}


def torch_missing(tool: str, install: str = "pip install torch") -> bool:
    """True, after one line on stderr naming the tool and how to install it, when torch (needed only
    to export the models) is not installed."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"{tool}: torch is not installed; it is needed only to export the models: {install}",
              file=sys.stderr)
        return True
    return False


def networks_or_status(tool: str, only: str) -> list[str] | int:
    """The networks `only` names (comma-separated), or an exit status after one line on stderr:
    2 for a name this module does not build, 3 when torch is not installed."""
    archs = [a.strip() for a in only.split(",") if a.strip()]
    unknown = [a for a in archs if a not in ALL]
    if unknown:
        print(f"{tool}: unknown network {unknown[0]} (known: {', '.join(ALL)})", file=sys.stderr)
        return 2
    return 3 if torch_missing(tool) else archs


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


def network_arguments(doc: str, networks, argv=None):
    """--only (some of networks), --size and --results, parsed: what the scripts that export networks
    at run time share (predict_socs.py, int8_oracle.py)."""
    import argparse
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(networks), help="comma-separated: " + ", ".join(networks))
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--results", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    args.only = [a.strip() for a in args.only.split(",") if a.strip()]
    return args
