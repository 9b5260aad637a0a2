"""An abort noticed between a stage's layers, not only in its waits.

A confined device computes a MobileNetV2 stage's backward of one
micro-batch in about a second; a portal that aborts the sync-round (a peer is
lost, :mod:`.recovery`) would wait that long for every survivor to answer,
since the stage's waits (receives, sends) are the only places the abort was
checked. Asteroid §3.4 and FTPipeHD §III-E both count recovery from the
failure's detection, so the survivors' stop is on the critical path.

:func:`abort_between_layers` checks the abort before each layer's forward
and, through a hook on that layer's input, after its backward: a survivor
stops within one layer's compute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from ecofl.net.links import AbortCheck


@contextlib.contextmanager
def abort_between_layers(stage: nn.Sequential, abort: AbortCheck) -> Iterator[None]:
    """While the block runs, ``abort`` is called before each layer of ``stage`` computes its forward, and once
    its backward has produced the gradient of its input; whatever ``abort`` raises stops the forward or the
    ``backward()`` call. The hooks are removed on leaving (the layers are shared with later epochs' stages)."""

    def before_forward(_layer: nn.Module, inputs: tuple) -> None:
        abort()
        for x in inputs:
            if isinstance(x, torch.Tensor) and x.requires_grad:
                x.register_hook(after_backward)

    def after_backward(_grad: torch.Tensor) -> None:
        abort()

    handles = [layer.register_forward_pre_hook(before_forward) for layer in stage]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
