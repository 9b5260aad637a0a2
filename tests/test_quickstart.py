"""The README's first command says what it will do; these tests keep that true.

``docs/results/quickstart/`` is a fresh run of ``+experiment=quickstart``
(``python -m simulations.run +experiment=quickstart``, copied with its
``.hydra/config.yaml``). The README and docs/simulation.md quote its updates
and virtual seconds; the quickstart's configuration must still be the one
that run used; and the same event loop, run here in one process on the
same homes (Flower changes no number: ``tests/test_simulation.py``), must
still give its first updates. A change that moves the quickstart fails here
until the run is made again and the figures updated.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from client.federation import federation
from ecofl.fl.inprocess import InProcessTransport
from ecofl.fl.loop import EventLoop
from server.config import experiment
from server.evaluation import GlobalEvaluator

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "docs" / "results" / "quickstart"
SUMMARY = json.loads((RUN / "summary.json").read_text())
COMPARED = ("update", "virtual_time", "group", "homes", "stragglers", "accuracy")


def quickstart_settings() -> dict:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=["+experiment=quickstart"]), resolve=True)


def test_the_readme_and_the_docs_quote_the_archived_run():
    updates, seconds = SUMMARY["updates"], round(SUMMARY["virtual_time_s"])
    assert SUMMARY["stop_reason"] == "target_accuracy" and SUMMARY["final_accuracy"] >= 0.6
    first_command = (ROOT / "README.md").read_text().splitlines()[3]
    assert "+experiment=quickstart" in first_command
    assert f"{updates} global updates, {seconds} virtual seconds" in first_command
    assert f"after {updates} updates, {seconds} virtual seconds" in (ROOT / "docs" / "simulation.md").read_text()


def test_the_archived_run_used_the_quickstart_as_configured_now():
    archived = yaml.safe_load((RUN / ".hydra" / "config.yaml").read_text())
    assert archived == quickstart_settings()


@pytest.mark.slow
def test_the_loop_still_gives_the_archived_runs_first_updates():
    """Two updates of the 300-home quickstart in one process (about half a minute here)."""
    exp = experiment(quickstart_settings())
    fed = federation(exp.setup.to_json())
    transport = InProcessTransport(fed.new_model, fed.dataset.train.x, fed.dataset.train.y, fed.parts,
                                   fed.latency_model, num_classes=fed.dataset.num_classes)
    evaluator = GlobalEvaluator(exp)
    config = replace(exp.loop, max_updates=2)
    rows = EventLoop(config, transport, range(exp.setup.num_homes), evaluator.initial_weights(), evaluator,
                     progress=False).run()
    archived = json.loads((RUN / "metrics.json").read_text())[:2]
    assert [{k: r[k] for k in COMPARED if k != "accuracy"} for r in rows] == \
        [{k: r[k] for k in COMPARED if k != "accuracy"} for r in archived]
    assert archived[1]["accuracy"] == pytest.approx(rows[1]["accuracy"], abs=1e-9)  # the quickstart evaluates every 2
