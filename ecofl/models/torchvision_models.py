"""MobileNetV2, EfficientNet-B0..B7 and ResNet-18/50 from torchvision, as layer sequences.

The networks are torchvision's (``weights=None``: never pretrained), re-assembled
into one ``nn.Sequential`` of their blocks with the functional ops of their
``forward`` (global average pooling, ``torch.flatten``) as explicit modules, so
that :mod:`ecofl.models.layers` can cut them. Parameters are torchvision's own
modules, initialised by torchvision.

Adaptations, all documented here:

- **Input channels**: the stem convolution takes ``input_shape[0]`` channels
  (1 for MNIST-like data), initialised like torchvision's (Kaiming normal, fan-out).
- **Small inputs** (``min(H, W) < SMALL_INPUT``, e.g. 8, 28 or 32 px): the
  ImageNet networks downsample by 32, which leaves nothing of a 32-px image. As
  is common for CIFAR (He et al. 2016 §4.2; kuangliu/pytorch-cifar), the
  downsampling drops to 8: MobileNetV2 and EfficientNet get a stride-1 stem and
  their first strided block (stage 2) runs at stride 1; ResNet gets a 3x3
  stride-1 stem convolution and no max-pool. Larger inputs keep the ImageNet
  layout.
- **No in-place ops** (ReLU, ReLU6, SiLU, Dropout get ``inplace=False``): a
  pipeline stage may start at any layer, and an in-place op on the stage's input
  (a leaf that requires grad) is an autograd error.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial

import importlib

from torch import nn

from ecofl.errors import UserError

SMALL_INPUT = 64
"""Inputs whose smaller side is below this many pixels get the CIFAR-style layout."""

_EFFICIENTNETS = tuple(f"efficientnet_b{i}" for i in range(8))
_RESNETS = ("resnet18", "resnet50")


def _tv(name: str) -> Callable[..., nn.Module]:
    """torchvision's builder ``name``, imported when a model is built (torchvision takes a second to import,
    and a worker process of a model that is not torchvision's never needs it)."""
    return getattr(importlib.import_module("torchvision.models"), name)


def mobilenet_v2(input_shape: tuple[int, int, int], num_classes: int, *, width: float = 1.0) -> nn.Sequential:
    """MobileNetV2 (Sandler et al. 2018) with width multiplier ``width``.

    Blocks: stem, 17 inverted-residual blocks, head convolution, pool, flatten, classifier.
    """
    if not width > 0:
        raise UserError(f"mobilenet_v2: width must be positive, got {width}")
    net = _tv("mobilenet_v2")(weights=None, num_classes=num_classes, width_mult=float(width))
    stem, *blocks, head_conv = net.features
    _adapt_stem(stem, input_shape)
    if _is_small(input_shape):
        _unstride_first(blocks)
    layers = [("stem", stem)]
    layers += [(f"block{i}", block) for i, block in enumerate(blocks, start=1)]
    layers += [("head_conv", head_conv)]
    return _finish(layers, nn.AdaptiveAvgPool2d((1, 1)), net.classifier)


def efficientnet(variant: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Sequential:
    """EfficientNet-B0..B7 (Tan & Le 2019), ``variant`` in ``efficientnet_b0`` .. ``efficientnet_b7``.

    Blocks: stem, every MBConv block (named ``stage{s}_{i}``), head
    convolution, pool, flatten, classifier.
    """
    net = _tv(variant)(weights=None, num_classes=num_classes)
    stem, *stages, head_conv = net.features
    _adapt_stem(stem, input_shape)
    if _is_small(input_shape):
        _unstride_first(stages)
    layers = [("stem", stem)]
    for s, stage in enumerate(stages, start=1):
        layers += [(f"stage{s}_{i}", block) for i, block in enumerate(stage)]
    layers += [("head_conv", head_conv)]
    return _finish(layers, net.avgpool, net.classifier)


def resnet(variant: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Sequential:
    """ResNet-18 / ResNet-50 (He et al. 2016), ``variant`` in ``resnet18``, ``resnet50``.

    Blocks: stem (conv, bn, relu[, max-pool]), every BasicBlock / Bottleneck
    (named ``layer{s}_{i}``), pool, flatten, fc.
    """
    net = _tv(variant)(weights=None, num_classes=num_classes)
    if _is_small(input_shape):
        net.conv1 = _new_conv(net.conv1, input_shape[0], kernel_size=3, stride=1, padding=1)
        stem = nn.Sequential(net.conv1, net.bn1, net.relu)
    else:
        net.conv1 = _new_conv(net.conv1, input_shape[0])
        stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
    layers = [("stem", stem)]
    for s, stage in enumerate((net.layer1, net.layer2, net.layer3, net.layer4), start=1):
        layers += [(f"layer{s}_{i}", block) for i, block in enumerate(stage)]
    return _finish(layers, net.avgpool, net.fc)


def torchvision_builders() -> dict[str, Callable[..., nn.Sequential]]:
    """Registry entries: model name -> ``builder(input_shape, num_classes, **options)``."""
    builders: dict[str, Callable[..., nn.Sequential]] = {"mobilenet_v2": mobilenet_v2}
    builders |= {name: partial(efficientnet, name) for name in _EFFICIENTNETS}
    builders |= {name: partial(resnet, name) for name in _RESNETS}
    return builders


def _is_small(input_shape: tuple[int, int, int]) -> bool:
    return min(input_shape[1:]) < SMALL_INPUT


def _adapt_stem(stem: nn.Sequential, input_shape: tuple[int, int, int]) -> None:
    """Replace the stem's first conv (of a ``Conv2dNormActivation``): input channels, stride 1 if small."""
    stride = (1, 1) if _is_small(input_shape) else stem[0].stride
    stem[0] = _new_conv(stem[0], input_shape[0], stride=stride)


def _new_conv(conv: nn.Conv2d, in_channels: int, **changes: int | tuple[int, int]) -> nn.Conv2d:
    """A fresh copy of ``conv`` with ``in_channels`` and ``changes`` (kernel_size, stride, padding)."""
    settings = dict(
        kernel_size=conv.kernel_size, stride=conv.stride, padding=conv.padding, bias=conv.bias is not None
    )
    new = nn.Conv2d(in_channels, conv.out_channels, **(settings | changes))
    nn.init.kaiming_normal_(new.weight, mode="fan_out")  # as torchvision initialises convolutions
    if new.bias is not None:
        nn.init.zeros_(new.bias)
    return new


def _unstride_first(blocks: list[nn.Module]) -> None:
    """Set the first strided convolution in ``blocks`` to stride 1 (its padding keeps the size).

    That block (stage 2's first) also changes its channel count, so it has no
    residual connection at either stride: its ``use_res_connect`` stays right.
    """
    conv = next(m for block in blocks for m in block.modules() if isinstance(m, nn.Conv2d) and m.stride != (1, 1))
    conv.stride = (1, 1)


def _finish(layers: list[tuple[str, nn.Module]], pool: nn.Module, classifier: nn.Module) -> nn.Sequential:
    """Append the head (pool, flatten, classifier) and turn off in-place ops."""
    model = nn.Sequential(OrderedDict([*layers, ("pool", pool), ("flatten", nn.Flatten()), ("classifier", classifier)]))
    for module in model.modules():
        if hasattr(module, "inplace"):
            module.inplace = False
    return model
