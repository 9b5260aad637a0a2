"""What a worker holds of the model: its layers' live tensors, and committed copies of layers by version.

A worker builds the whole model (every layer's tensors exist in it), so a
layer that migrates to it only needs its values copied in. Per layer the
*state* is its ``state_dict`` entries plus, for parameters, SGD's momentum
buffer (``momentum/<key>``): a migration or a replica carries both, so a
re-planned optimizer continues exactly (FTPipeHD §III-E replicates weights,
Asteroid §3.4 stage models; both need the optimizer state for an exact
replay).

A **version** is a number of completed sync-rounds, and a synchronous
pipeline has exactly one state of each layer at each version. So a worker's
committed copies are one store, ``copies[version]``, holding whatever layers
it has at that version: its own stage (captured when the version is
committed, at the end of a sync-round) and the stages it backs up for others
(replicas, :mod:`ecofl.pipeline.replication`). A sync-round interrupted by a
failure is rolled back to a committed copy, so it is never half applied; the
portal restores a lost device's layers from whichever survivor holds them
at the version it resumes from (:meth:`StageState.holdings`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

import numpy as np
import torch
from torch import nn

from ecofl.accelerator import host_array
from ecofl.pipeline.runtime.byte_stream import stream_buffers
from ecofl.pipeline.runtime.model_spec import layer_state_keys
from ecofl.pipeline.runtime.spare_blocks import SpareBlocks

MOMENTUM = "momentum/"

State = dict[str, torch.Tensor]
T = TypeVar("T")


class StageState:
    """The model's tensors by key, grouped by layer, and committed copies of layers by version."""

    def __init__(self, model: nn.Module, layers: list[nn.Module]):
        self.model = model
        self.layer_keys = layer_state_keys(model, layers)
        self.tensors: dict[str, torch.Tensor] = dict(model.state_dict(keep_vars=True))
        self.parameter_keys = {k for k, _ in model.named_parameters()}
        self.copies: dict[int, State] = {}  # version -> the state of every layer held at that version
        self.spares = SpareBlocks()  # the memory of the copies the last keep() dropped

    def keys(self, layers: Iterable[int]) -> list[str]:
        return [key for layer in layers for key in self.layer_keys[layer]]

    def capture(self, layers: Iterable[int], momentum: dict[str, torch.Tensor], with_momentum: bool) -> State:
        """A copy of ``layers``' tensors and, ``with_momentum``, every parameter's momentum buffer, laid end to
        end as a stream carries them (:func:`~.byte_stream.stream_buffers`: a replica of it is sent as views).

        A parameter without a buffer yet (before the first step) gets zeros:
        SGD (dampening 0) starts a buffer at the first gradient, exactly what
        a zero buffer gives, and every copy of a stage then lists the same tensors.
        """
        sources: dict[str, torch.Tensor | None] = {}
        for key in self.keys(layers):
            sources[key] = self.tensors[key].detach()
            if with_momentum and key in self.parameter_keys:
                sources[MOMENTUM + key] = momentum.get(key)
        state = self._laid_out({key: self.tensors[key.removeprefix(MOMENTUM)] for key in sources})
        with torch.no_grad():
            for key, source in sources.items():
                state[key].copy_(source) if source is not None else state[key].zero_()
        return state

    def hold(self, version: int, state: State) -> None:
        """Keep ``state`` (layers' tensors) as committed at ``version``."""
        self.copies.setdefault(version, {}).update(state)

    def holdings(self) -> dict[int, list[int]]:
        """``{version: layers held at it}`` (layers with state only)."""
        return {version: [layer for layer, keys in enumerate(self.layer_keys) if keys and all(k in held for k in keys)]
                for version, held in self.copies.items()}

    def restore(self, state: State) -> dict[str, torch.Tensor]:
        """Copy ``state``'s tensors into the model; return its momentum buffers by parameter key."""
        momentum = {}
        with torch.no_grad():
            for key, value in state.items():
                if key.startswith(MOMENTUM):
                    momentum[key[len(MOMENTUM):]] = value.clone()
                else:
                    self.tensors[key].copy_(value)
        return momentum

    def keep(self, versions: set[int]) -> None:
        """Drop the copies of every other version; each waits, laid out, for the next copy of its layout
        (:mod:`.spare_blocks`), unless a copy kept or the model's own tensors share its memory."""
        dropped = [item for version in set(self.copies) - versions for item in self.copies.pop(version).items()]
        in_use = [tensor for held in self.copies.values() for tensor in held.values()]
        self.spares.release(dropped, in_use + list(self.tensors.values()))

    def layers_state(self, layers: Iterable[int], version: int) -> State:
        """The committed state of ``layers`` at ``version``; RuntimeError if this worker does not hold it."""
        held = self.copies.get(version, {})
        layers = list(layers)
        keys = self.keys(layers)
        if not all(k in held for k in keys):
            raise RuntimeError(f"layers {layers} at version {version} are not held here (held: {self.holdings()})")
        return with_momentum_of(held, keys)

    def empty_like_layers(self, layers: Iterable[int], with_momentum: bool) -> State:
        """Receive buffers for the state of ``layers`` (shapes and dtypes from the model), laid out as a stream
        carries them (:func:`~.byte_stream.stream_buffers`)."""
        likes = {}
        for key in self.keys(layers):
            likes[key] = self.tensors[key]
            if with_momentum and key in self.parameter_keys:
                likes[MOMENTUM + key] = self.tensors[key]
        return self._laid_out(likes)

    def _laid_out(self, likes: Mapping[str, torch.Tensor]) -> State:
        """Empty host tensors shaped like ``likes``, laid out as a stream carries them: a dropped copy of that
        layout where one waits (:mod:`.spare_blocks`), else a new block (:func:`~.byte_stream.stream_buffers`)."""
        return self.spares.take(likes) or stream_buffers(likes)

    def held_bytes(self, own: Iterable[str]) -> int:
        """Bytes held beside the live stage: the copies of layers other than ``own`` keys (the replicas a backup
        keeps for others), and the dropped copies' memory waiting for the next commit (:mod:`.spare_blocks`)."""
        own = set(own)
        return self.spares.spare_bytes + sum(
            t.numel() * t.element_size() for held in self.copies.values() for k, t in held.items()
            if k not in own and (not k.startswith(MOMENTUM) or k[len(MOMENTUM):] not in own))


def with_momentum_of(state: Mapping[str, T], keys: Iterable[str]) -> dict[str, T]:
    """The entries of ``state`` for ``keys``, with their momentum buffers."""
    keys = set(keys)
    return {k: v for k, v in state.items() if k in keys or (k.startswith(MOMENTUM) and k[len(MOMENTUM):] in keys)}


def as_arrays(state: State) -> dict[str, np.ndarray]:
    return {key: host_array(value) for key, value in state.items()}


def from_arrays(arrays: dict[str, np.ndarray]) -> State:
    return {key: torch.from_numpy(np.array(value)) for key, value in arrays.items()}
