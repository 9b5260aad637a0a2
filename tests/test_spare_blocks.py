"""The memory of dropped copies reused by the next copies of the same size (ecofl.pipeline.runtime.spare_blocks),
and the time per copied byte the cost model charges for them (ecofl.pipeline.runtime.copy_cost)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ecofl.pipeline.runtime.byte_stream import end_to_end, in_stream_order, stream_buffers
from ecofl.pipeline.runtime.spare_blocks import SpareBlocks
from ecofl.pipeline.runtime.stage_state import StageState


def test_a_dropped_copy_is_taken_again_whole_by_layout_unless_something_kept_shares_it():
    spares = SpareBlocks()
    state = {"w": torch.randn(4, 4), "b": torch.randn(4)}
    old, shared = stream_buffers(state), stream_buffers(state)
    spares.release([*old.items(), *shared.items()], in_use=[shared["b"]])  # a kept copy still uses `shared`
    assert spares.spare_bytes == 80
    assert spares.take({"w": state["w"], "c": state["b"]}) is None  # same bytes, another layout
    assert spares.take({"w": state["w"], "b": state["b"].double()}) is None
    again = spares.take(state)
    assert again is not None and all(again[k] is old[k] for k in state)  # the old copy's own views
    assert spares.take(state) is None and spares.spare_bytes == 0  # `shared` was never offered
    spares.release(again.items(), in_use=[])
    spares.release([], in_use=[])  # offered, not taken before the next release: let go
    assert spares.take(state) is None


def test_only_whole_blocks_are_offered_not_part_of_one():
    spares = SpareBlocks()
    state = {"w": torch.randn(4, 4), "b": torch.randn(4)}
    laid = stream_buffers(state)
    spares.release([("w", laid["w"]), ("own", torch.randn(4))], in_use=[])  # "b" of the block not dropped
    assert spares.spare_bytes == 16 and spares.take({"w": state["w"]}) is None  # only the tensor with its own
    spares.release(laid.items(), in_use=[])
    assert spares.spare_bytes == 80


def test_a_worker_commits_and_receives_into_the_memory_of_the_copies_it_dropped():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    state = StageState(model, list(model))
    for version in range(3):  # commit a version a round, keep the last two
        state.keep({version - 1, version})
        replica = state.empty_like_layers([2], with_momentum=True)  # a neighbour's layer arriving
        state.hold(version, replica)
        state.hold(version + 1, state.capture([0, 1], {}, with_momentum=True))
    # round 3 drops version 1: its replica's block and its commit's block come back for the same uses
    dropped = state.copies[1]
    dropped_replica = end_to_end(in_stream_order({k: v for k, v in dropped.items() if "2." in k})).data_ptr()
    dropped_commit = end_to_end(in_stream_order({k: v for k, v in dropped.items() if "2." not in k})).data_ptr()
    state.keep({2, 3})
    assert end_to_end(in_stream_order(state.empty_like_layers([2], with_momentum=True))).data_ptr() == dropped_replica
    kept = {t.untyped_storage().data_ptr() for held in state.copies.values() for t in held.values()}
    committed = state.capture([0, 1], {}, with_momentum=True)
    assert end_to_end(in_stream_order(committed)).data_ptr() == dropped_commit
    assert committed["0.weight"].untyped_storage().data_ptr() not in kept  # never the memory of a copy kept
    assert all(torch.equal(committed[k], state.tensors[k]) for k in committed if not k.startswith("momentum/"))


def test_a_hosts_time_per_copied_byte_is_measured_on_the_copy_path_once_then_read_from_its_cache(tmp_path,
                                                                                                   monkeypatch):
    from ecofl.pipeline.runtime import copy_cost

    paced = copy_cost.host_copy_byte_s(paced=True, cache_dir=str(tmp_path))
    assert copy_cost.record_path(str(tmp_path)).exists()
    monkeypatch.setattr(copy_cost, "measure_copy_byte_s", lambda **_: pytest.fail("measured again"))
    unpaced = copy_cost.host_copy_byte_s(paced=False, cache_dir=str(tmp_path))
    for measured in (paced, unpaced):
        assert 0 < measured < 1e-7  # CPU seconds a byte at one end: 100 ns would be 10 MB/s of a host core
    assert copy_cost.host_copy_byte_s(paced=True, cache_dir=str(tmp_path)) == paced
