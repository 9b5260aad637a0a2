"""A new stage's first round: benchmarks/first_touch.py (its first round against its later ones, in one process),
the cost model's part (ecofl.pipeline.first_touch) and its measure in the calibration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.first_touch import first_against_later, main, rounds_of  # noqa: E402
from ecofl.cli.home_train import first_round_line  # noqa: E402
from ecofl.devices import DeviceSpec, HomePool  # noqa: E402
from ecofl.pipeline.first_touch import first_round_extra_s, mapped_bytes, switching_s  # noqa: E402
from ecofl.pipeline.plan import Plan, StagePlan  # noqa: E402
from pipeline_kit import synthetic_profile  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_the_first_round_is_compared_with_the_median_of_the_later_ones():
    rounds = [{"wall_s": 5.0, "cpu_s": 0.6, "mapped_bytes": 300 << 20},
              {"wall_s": 2.0, "cpu_s": 0.2, "mapped_bytes": 1 << 20},
              {"wall_s": 3.0, "cpu_s": 0.3, "mapped_bytes": 0},
              {"wall_s": 9.0, "cpu_s": 0.9, "mapped_bytes": 2 << 20}]
    run = first_against_later(rounds)
    assert run["extra_wall_s"] == pytest.approx(2.0) and run["extra_cpu_s"] == pytest.approx(0.3)
    assert run["first_touched_mib"] == pytest.approx(300 - 1)
    assert run["cpu_ms_per_mib"] == pytest.approx(1000 * 0.3 / run["first_touched_mib"])
    assert first_against_later([rounds[1], rounds[1]])["cpu_ms_per_mib"] is None  # nothing touched first


def test_a_stage_faults_its_stash_in_its_first_round_only():
    """At host speed (no cgroup): the new stage's first round maps its held activations; the later rounds
    reuse the memory the process kept (ecofl.allocator)."""
    settings = {"input_shape": [1, 28, 28], "rounds": 3, "before": [9, 13, 2, 2, 2], "after": [0, 3, 8, 3, 3]}
    rounds = rounds_of(settings, None)
    assert len(rounds) == 3 and all(r["wall_s"] > 0 and r["cpu_s"] > 0 for r in rounds)
    # A later round still maps a few MiB now and then (0-14 MiB against the first's 131-137, 2026-12-04); without
    # the kept memory it would map as much as the first.
    assert rounds[0]["minor_faults"] > 5 * max(r["minor_faults"] for r in rounds[1:])
    assert rounds[0]["mapped_bytes"] > 5 * max(r["mapped_bytes"] for r in rounds[1:])


def test_one_round_cannot_be_compared(capsys):
    with pytest.raises(SystemExit):
        main(["--rounds", "1"])
    assert "--rounds must be at least 2" in capsys.readouterr().err


# -- the cost model's part (ecofl.pipeline.first_touch) and its measure (the calibration's first step) ---------

def touching(*s_per_byte: float | None) -> HomePool:
    """A pool whose device d maps a byte anew in ``s_per_byte[d]`` seconds (None: not measured)."""
    return HomePool("test", tuple(DeviceSpec(f"d{d}", 1.0, 1 << 30, 1e9, first_touch_s_per_byte=seconds)
                                  for d, seconds in enumerate(s_per_byte)))


def two_stage(devices: tuple[int, int], micro_batch: int, cut: int = 2) -> Plan:
    return Plan("hand", (StagePlan((0, cut), (devices[0],), (micro_batch,), 2),
                         StagePlan((cut + 1, 4), (devices[1],), (micro_batch,), 1)), micro_batch, 4)


def test_a_device_maps_its_stage_beyond_the_weights_once():
    profile = synthetic_profile(5, activation=1e6, weight=1e6)
    plan = two_stage((0, 1), 4)
    mapped = mapped_bytes(plan, profile)
    assert set(mapped) == {0, 1} and mapped[0] > mapped[1] > 0  # the first stage holds more layers and stashes
    # a run's first round: every device maps its stage; the slowest mapping is the round's extra
    assert first_round_extra_s(plan, profile, touching(1e-9, 1e-9)) == pytest.approx(mapped[0] * 1e-9)
    assert first_round_extra_s(plan, profile, touching(1e-9, 1e-6)) == pytest.approx(mapped[1] * 1e-6)
    # the same plan again maps nothing new; a device with no measurement leaves the round unpredicted
    assert first_round_extra_s(plan, profile, touching(1e-9, 1e-9), before=plan) == 0
    assert first_round_extra_s(plan, profile, touching(1e-9, None)) is None


def test_a_re_plan_costs_what_a_device_holds_beyond_its_last_stage():
    """The devices swap stages: device 1 maps what the first stage holds beyond its old one; device 0, now on the
    smaller stage, maps nothing."""
    profile = synthetic_profile(5, activation=1e6, weight=1e6)
    before, after = two_stage((0, 1), 4), two_stage((1, 0), 4)
    grown = mapped_bytes(after, profile)[1] - mapped_bytes(before, profile)[1]
    assert grown > 0
    assert first_round_extra_s(after, profile, touching(1e-9, 1e-9), before=before) == pytest.approx(grown * 1e-9)
    bigger = two_stage((1, 0), 8)  # twice the micro-batch: twice the stash to map
    assert first_round_extra_s(bigger, profile, touching(1e-9, 1e-9), before=before) > grown * 1e-9
    # switching counts it beside the layer moves (none here: both devices hold every layer). Device 1 unmeasured
    # leaves the first round unpredicted; a re-plan takes it at the measured devices' mean, not as free
    everywhere = {layer: [0, 1] for layer in range(5)}
    assert switching_s(after, before, everywhere, profile, touching(1e-9, 3e-9)) == pytest.approx(grown * 3e-9)
    assert first_round_extra_s(after, profile, touching(1e-9, None), before=before) is None
    assert switching_s(after, before, everywhere, profile, touching(1e-9, None)) == pytest.approx(grown * 1e-9)
    assert switching_s(after, before, everywhere, profile, touching(None, None)) == 0  # nothing measured


def test_the_cli_says_the_final_plans_first_round_beside_its_prediction():
    """After a re-plan (rounds 0-1 on the first plan, 2-3 on the final one) the line reads round 2."""
    report = {"predicted_first_round_s": 7.25, "sync_rounds_s": [9.0, 5.0, 8.0, 5.5], "final_plan_rounds": 2,
              "first_touched_mib_by_round": [240.0, 20.0, 515.4, 9.0]}
    assert first_round_line(report) == ["its first sync-round 8.000 s measured, 7.250 s predicted (a device "
                                         "mapped up to 515 MiB for the first time)"]
    assert first_round_line({**report, "predicted_first_round_s": None}) == []  # not calibrated


FIRST_STEP = """
import sys, torch
from ecofl.allocator import keep_freed_memory
from ecofl.pipeline.runtime.process_memory import first_touch_cpu_s_per_byte, mapped_since, resident_from_now
keep_freed_memory()  # as every worker and calibrating device does
if sys.argv[1] == "after-freeing":  # earlier work allocated 64 MiB and freed it: the process kept the memory
    freed = [torch.ones(1 << 20) for _ in range(16)]
    del freed
if sys.argv[2] == "per-byte":
    print(first_touch_cpu_s_per_byte())
else:  # a step that allocates 64 MiB in blocks of 4 and keeps them (as a stage keeps its state)
    resident = resident_from_now()
    kept = [torch.ones(1 << 20) for _ in range(16)]
    print(mapped_since(resident))
"""


def fresh_process(before: str, measure: str) -> float:
    done = subprocess.run([sys.executable, "-c", FIRST_STEP, before, measure],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout)  # "None" fails here


def test_memory_the_process_freed_and_kept_is_not_mapped_again():
    """Why a step is no sample of what a byte costs to map: after other work freed memory and the allocator kept
    it, the step maps next to nothing (as a worker's later rounds do, and a calibrating device's first step after
    computing its stage's input did; docs/pipeline.md, "A new stage's first round")."""
    assert fresh_process("fresh", "mapped") >= (64 << 20) * 0.9
    assert fresh_process("after-freeing", "mapped") < (64 << 20) / 4


@pytest.mark.parametrize("before", ["fresh", "after-freeing"])
def test_the_cpu_of_a_byte_mapped_anew_is_measured_whatever_the_process_did_before(before):
    """A mapping of its own: between 0.1 us and 100 ms of CPU a MiB (a page fault's order), also in a process
    that holds freed memory it would reuse."""
    assert 1e-13 < fresh_process(before, "per-byte") < 1e-7
