"""Dropped copies reused whole by the next copy of the same layout: a round that copies maps and lays out nothing.

With fault tolerance a worker commits a copy of its stage every sync-round,
receives its neighbours' replicas into new blocks
(:func:`~.byte_stream.stream_buffers`), and drops the copies of the versions
the portal no longer needs (:meth:`~.stage_state.StageState.keep`). The
allocator keeps freed memory (:mod:`ecofl.allocator`), yet on Eco-FL's
confined testbed the device backing the last stage up still mapped the last
stage's replica anew, 13 MiB, in almost every round (``first_touched_mib_by_round``,
``benchmarks/steady_runs.py``, 2026-12-03 01:02), and a confined device pays
for every new page out of its quota (3-5 ns of host CPU a byte, the
calibration's ``first_touch_s_per_byte``). Laying a block out costs too,
three tensor views a tensor, and a commit and each replica received laid
one out every round. Here a copy the round drops waits, as the views it was
laid out in, for the copy the same round asks for with the same keys,
dtypes and shapes: a replica of the same layers, the next commit of the
same stage. A round's copies on MobileNetV2's last stage (121 tensors: the
keep, a neighbour's replica buffers, the commit) took 3.1-3.6 ms of host
CPU, against 4.7-5.9 ms when only the storages waited (five processes of
each, alternating; a scratch measurement, 2026-12-03 08:30).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from ecofl.pipeline.runtime.byte_stream import end_to_end, in_stream_order, stream_keys

#: What a laid-out copy must match to be reused: each tensor's key, dtype, shape and device, in stream order.
Layout = tuple[tuple[str, torch.dtype, tuple[int, ...], torch.device], ...]


def layout_of(state: Mapping[str, torch.Tensor]) -> Layout:
    """The layout of a state (or of the tensors a copy of it is shaped like)."""
    return tuple((key, state[key].dtype, tuple(state[key].shape), state[key].device) for key in stream_keys(state))


class SpareBlocks:
    """Dropped copies, each still laid out on its block, by layout, until the next release."""

    def __init__(self) -> None:
        self._spare: dict[Layout, list[dict[str, torch.Tensor]]] = {}

    def release(self, dropped: Iterable[tuple[str, torch.Tensor]], in_use: Iterable[torch.Tensor]) -> None:
        """Offer the copies among ``dropped`` (key, tensor) for reuse: the tensors of one host block, where they
        fill it end to end (as :func:`~.byte_stream.stream_buffers` laid them) and no tensor ``in_use`` shares
        it. What the last release offered and nobody took is let go (a new plan's copies have other layouts)."""
        used = {tensor.untyped_storage().data_ptr() for tensor in in_use}
        blocks: dict[int, dict[str, torch.Tensor]] = {}
        for key, tensor in dropped:
            storage = tensor.untyped_storage()
            if tensor.device.type == "cpu" and storage.nbytes() and storage.data_ptr() not in used:
                blocks.setdefault(storage.data_ptr(), {})[key] = tensor
        self._spare = {}
        for state in blocks.values():
            block = end_to_end(in_stream_order(state))
            if block is not None and block.storage_offset() == 0 and block.numel() == block.untyped_storage().nbytes():
                self._spare.setdefault(layout_of(state), []).append(state)

    def take(self, likes: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """A dropped copy laid out as a copy of ``likes`` would be, its contents stale (None: none)."""
        states = self._spare.get(layout_of(likes))
        return states.pop() if states else None

    @property
    def spare_bytes(self) -> int:
        """The bytes offered and not taken yet."""
        return sum(next(iter(state.values())).untyped_storage().nbytes()
                   for states in self._spare.values() for state in states)
