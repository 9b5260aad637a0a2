"""Recovery is exact whenever a device fails: mid-forward, mid-backward, in a send, the all-reduce, the step,
replication, the global copy, a migration, or a recovery itself (Asteroid §3.4's replay, FTPipeHD §III-F).

Each test aims a real ``kill -9`` (or ``SIGSTOP``) at one moment of a
device's work (``kill:D@R:PHASE:K``, :mod:`ecofl.pipeline.runtime.traps`)
and compares the final weights with single-process gradient accumulation
over the same mini-batches (atol 1e-5). A failure injected at a round's
start is :mod:`tests.test_runtime_recovery`'s matter.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from ecofl.net.liveness import SILENT
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.runtime import LayerList
from ecofl.pipeline.runtime.faults import Injection
from pipeline_kit import random_profile, train_exactly

pytestmark = pytest.mark.timeout(240)

MLP = LayerList((
    ("Linear", {"in_features": 6, "out_features": 16}), ("Tanh", {}),
    ("Linear", {"in_features": 16, "out_features": 16}), ("Tanh", {}),
    ("Linear", {"in_features": 16, "out_features": 16}), ("Tanh", {}),
    ("Linear", {"in_features": 16, "out_features": 12}), ("Tanh", {}),
    ("Linear", {"in_features": 12, "out_features": 3}),
))
PROFILE = random_profile(np.random.default_rng(1), 9)
FOUR_STAGES = Plan("hand", (StagePlan((0, 1), (0,), (4,), 7), StagePlan((2, 3), (1,), (4,), 5),
                            StagePlan((4, 6), (2,), (4,), 3), StagePlan((7, 8), (3,), (4,), 1)),
                   micro_batch=4, num_micro_batches=6)
HYBRID = Plan("hand", (StagePlan((0, 3), (0, 1), (2, 2), 3), StagePlan((4, 8), (2,), (4,), 1)),
              micro_batch=4, num_micro_batches=6)
ROUNDS = 6


def run(plan: Plan, events: list[str], devices: int = 4, **settings):
    """:func:`tests.test_runtime_recovery.run` on the MLP: exact against one process, every round, no worker left."""
    return train_exactly(plan, events, devices, spec=MLP, profile=PROFILE, rounds=ROUNDS, **settings)


def devices_of(plan: Plan) -> set[int]:
    return {d for stage in plan.stages for d in stage.devices}


def test_a_kill_of_the_first_device_mid_backward_is_exact():
    """At its 2nd backward of round 3, when the later stages have accumulated gradients of at least two of the
    round's micro-batches: those must not count twice in the replay."""
    result, final = run(FOUR_STAGES, ["kill:0@3:backward:2"])
    [event] = result.events
    assert (event["kind"], event["device"], event["phase"], event["round"]) == ("kill", 0, "backward", 3)
    # stage 0's only layer with state, from device 1's replica (device 0 backs up to the next stage): the one sent
    # as round 3 started, or the one before it if that one was not complete yet
    [restored] = event["restored_from"]
    restored_where = {k: restored[k] for k in ("layers", "source", "device")}
    assert restored_where == {"layers": [0, 0], "source": "backup", "device": 1}
    assert 0 not in devices_of(final) and event["lost_rounds"] == 3 - restored["version"] in (0, 1)
    assert 0 < event["detected_after_s"] <= event["recovered_after_s"]


def test_a_kill_of_a_middle_device_mid_forward_is_exact():
    result, final = run(FOUR_STAGES, ["kill:1@3:forward:4"])
    [event] = result.events
    assert event["phase"] == "forward" and 1 not in devices_of(final)


def test_a_kill_during_replication_is_exact():
    """Device 2 dies just after posting its copy to its backup: some backups hold the new version, some not."""
    result, final = run(FOUR_STAGES, ["kill:2@3:replicate"])
    [event] = result.events
    assert event["phase"] == "replicate" and 2 not in devices_of(final)


def test_a_kill_during_recovery_from_a_first_kill_is_exact():
    """Device 0 dies mid-backward; device 2 dies as it starts re-configuring for that recovery."""
    result, final = run(FOUR_STAGES, ["kill:0@3:backward:2", "kill:2@3:recover"])
    assert {(e["device"], e["phase"]) for e in result.events} == {(0, "backward"), (2, "recover")}
    assert devices_of(final) == {1, 3}
    # the second loss keeps the reason it was found with: a closed channel or an ended process, not a stand-in
    assert all(re.search("closed|ended|exited", e["cause"]) for e in result.events), result.events


def test_a_kill_of_one_replica_of_a_hybrid_stage_during_its_all_reduce_is_exact():
    result, final = run(HYBRID, ["kill:1@3:allreduce"], devices=3)
    [event] = result.events
    assert event["phase"] == "allreduce"
    assert final.stages[0].devices == (0,)
    assert event["restored_from"] and all(r["source"] == "peer" and r["device"] == 0 for r in event["restored_from"])


@pytest.mark.parametrize("events", [
    ["kill:3@2:step"],  # the last stage stepped; the others may have too, the portal heard of none
    ["kill:2@4:send:3"],  # bytes of an activation in flight
    ["kill:1@2:global-copy"],  # while the portal collects its copy of the whole model
    ["freeze:2@3:backward:3"],  # SIGSTOP mid-backward, never resumed: found by heartbeats
    ["kill:0@2:backward:1", "kill:3@2:migrate"],  # the recovery's layer migration loses a device too
])
def test_a_failure_at_any_other_moment_is_exact(events):
    result, _ = run(FOUR_STAGES, events)
    assert len(result.events) == len(events)
    assert all(e["detected_after_s"] is not None and e["recovered_after_s"] is not None for e in result.events)
    # why each was declared lost: the frozen one by the heartbeats alone, at whatever moment it froze
    assert all(e["cause"] and (e["cause"] == SILENT) == (e["kind"] == "freeze") for e in result.events), result.events


def test_a_device_and_its_backup_lost_resume_from_the_global_copy_and_say_so():
    """The last device backs up to device 2 alone (a middle stage's to its neighbours but the busiest). Device 2 dies
    mid-backward in round 4, device 3 as the recovery starts: device 3's layers at version 4 are gone, so everything
    comes back from the global copy of round 3."""
    result, _ = run(FOUR_STAGES, ["kill:2@4:backward:1", "kill:3@4:recover"], global_copy_every=3)
    assert result.lost_rounds == 1 and {e["lost_rounds"] for e in result.events} == {1}
    sources = {r["source"] for e in result.events for r in e["restored_from"]}
    assert "global copy" in sources
    assert all(r["version"] == 3 for e in result.events for r in e["restored_from"])


def test_aimed_injection_syntax():
    from ecofl.errors import UserError

    assert Injection.parse("kill:0@3:backward:2") == Injection("kill", 0, 3, phase="backward", count=2)
    assert Injection.parse("freeze:1@2:replicate") == Injection("freeze", 1, 2, phase="replicate", count=1)
    for bad in ("kill:0@3:sideways", "kill:0@3:backward:0", "join:1@2:forward", "slow:1*2@3:forward"):
        with pytest.raises(UserError):
            Injection.parse(bad)
