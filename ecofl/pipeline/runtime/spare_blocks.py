"""The memory of dropped copies, reused by the next copy of the same size: a round that copies maps nothing new.

With fault tolerance a worker commits a copy of its stage every sync-round,
receives its neighbours' replicas into new blocks
(:func:`~.byte_stream.stream_buffers`), and drops the copies of the versions
the portal no longer needs (:meth:`~.stage_state.StageState.keep`). The
allocator keeps freed memory (:mod:`ecofl.allocator`), yet on Eco-FL's
confined testbed the device backing the last stage up still mapped the last
stage's replica anew, 13 MiB, in almost every round (``first_touched_mib_by_round``,
``benchmarks/steady_runs.py``, 2026-12-03 01:02), and a confined device pays
for every new page out of its quota (3-5 ns of host CPU a byte, the
calibration's ``first_touch_s_per_byte``). Here the storages of the copies a
round drops wait for the blocks the same round asks for, by size: a replica
of the same layers, the next commit of the same stage.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class SpareBlocks:
    """Host storages of dropped copies, by size, until the next release."""

    def __init__(self) -> None:
        self._spare: dict[int, list[torch.UntypedStorage]] = {}

    def release(self, dropped: Iterable[torch.Tensor], in_use: Iterable[torch.Tensor]) -> None:
        """Offer the storages of ``dropped`` tensors for reuse, except any that a tensor ``in_use`` shares; what
        the last release offered and nobody took is let go (a new plan's copies have other sizes)."""
        used = {tensor.untyped_storage().data_ptr() for tensor in in_use}
        storages = {}
        for tensor in dropped:
            storage = tensor.untyped_storage()
            if tensor.device.type == "cpu" and storage.nbytes() and storage.data_ptr() not in used:
                storages[storage.data_ptr()] = storage
        self._spare = {}
        for storage in storages.values():
            self._spare.setdefault(storage.nbytes(), []).append(storage)

    def take(self, nbytes: int) -> torch.Tensor | None:
        """A flat ``uint8`` block of exactly ``nbytes`` on the memory of a dropped copy (None: none that size)."""
        storages = self._spare.get(nbytes)
        if not storages:
            return None
        return torch.empty(0, dtype=torch.uint8).set_(storages.pop(), 0, (nbytes,))

    @property
    def spare_bytes(self) -> int:
        """The bytes offered and not taken yet."""
        return sum(nbytes * len(storages) for nbytes, storages in self._spare.items())
