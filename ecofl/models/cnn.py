"""The FedAvg CNN of McMahan et al. 2017 (§3, "CNN" for MNIST), for any input shape.

Two 5x5 convolutions (32 then 64 channels, each ReLU then 2x2 max-pool), a fully
connected layer of 512 units with ReLU and a linear output layer. The
convolutions are padded ("same", padding 2) so that small inputs such as the
8x8 scikit-learn digits keep a spatial extent; the flattened size follows from
``input_shape`` (each pool halves height and width, rounding down).
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from ecofl.errors import UserError


def fedavg_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Sequential:
    """Blocks: conv1 (conv, relu, pool), conv2 (conv, relu, pool), flatten, fc1 (linear, relu), fc2."""
    channels, height, width = input_shape
    if height < 4 or width < 4:
        raise UserError(f"cnn needs inputs of at least 4x4 pixels (two 2x2 pools), got {height}x{width}")
    flat = 64 * (height // 2 // 2) * (width // 2 // 2)
    return nn.Sequential(
        OrderedDict(
            conv1=_conv_block(channels, 32),
            conv2=_conv_block(32, 64),
            flatten=nn.Flatten(),
            fc1=nn.Sequential(nn.Linear(flat, 512), nn.ReLU()),
            fc2=nn.Linear(512, num_classes),
        )
    )


def _conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )
