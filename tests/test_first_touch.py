"""benchmarks/first_touch.py: a new stage's first round against its later ones, in one process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.first_touch import PAGE, first_against_later, main, rounds_of  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_the_first_round_is_compared_with_the_median_of_the_later_ones():
    rounds = [{"wall_s": 5.0, "cpu_s": 0.6, "minor_faults": 3000},
              {"wall_s": 2.0, "cpu_s": 0.2, "minor_faults": 10},
              {"wall_s": 3.0, "cpu_s": 0.3, "minor_faults": 0},
              {"wall_s": 9.0, "cpu_s": 0.9, "minor_faults": 20}]
    run = first_against_later(rounds)
    assert run["extra_wall_s"] == pytest.approx(2.0) and run["extra_cpu_s"] == pytest.approx(0.3)
    assert run["first_touched_mib"] == pytest.approx((3000 - 10) * PAGE / 2**20)
    assert run["cpu_ms_per_mib"] == pytest.approx(1000 * 0.3 / run["first_touched_mib"])
    assert first_against_later([rounds[1], rounds[1]])["cpu_ms_per_mib"] is None  # nothing touched first


def test_a_stage_faults_its_stash_in_its_first_round_only():
    """At host speed (no cgroup): the new stage's first round maps its held activations; the later rounds
    reuse the memory the process kept (ecofl.allocator)."""
    settings = {"input_shape": [1, 28, 28], "rounds": 3, "before": [9, 13, 2, 2, 2], "after": [0, 3, 8, 3, 3]}
    rounds = rounds_of(settings, None)
    assert len(rounds) == 3 and all(r["wall_s"] > 0 and r["cpu_s"] > 0 for r in rounds)
    assert rounds[0]["minor_faults"] > 10 * max(r["minor_faults"] for r in rounds[1:])


def test_one_round_cannot_be_compared(capsys):
    with pytest.raises(SystemExit):
        main(["--rounds", "1"])
    assert "--rounds must be at least 2" in capsys.readouterr().err
