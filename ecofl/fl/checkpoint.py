"""Checkpoints of the event loop: arrays in ``.npz``, everything else in ``.json`` (no pickle).

A checkpoint is a pair ``<stem>.json`` + ``<stem>.npz`` written atomically
(temporary file, then rename, the JSON last so a complete JSON means a
complete pair). Arrays are stored under names ``<prefix>/<index>`` so one
file holds several weight lists (the global model and the model each
in-flight round was dispatched with). :class:`LoopCheckpoint` is what the
event loop saves (:func:`save_loop`) and resumes from (:func:`load_loop`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ecofl.errors import UserError
from ecofl.fl.group_round import GroupRound
from ecofl.fl.metrics import write_json
from ecofl.weights import Weights

#: Version of the layout :func:`save_loop` writes (4: LoopState's busy homes).
CHECKPOINT_FORMAT = 4


@dataclass(frozen=True)
class LoopCheckpoint:
    """What the event loop saves: its settings (``LoopConfig`` as a dict), homes, clock and ``LoopState`` as
    JSON, the global model, the rounds in flight (each with the model it was sent) and the groups' models."""

    config: dict
    homes: list[int]
    clock: dict
    state: dict
    global_weights: Weights
    in_flight: list[GroupRound]
    group_models: Mapping[int, Weights]


def save_loop(stem: Path, saved: LoopCheckpoint) -> Path:
    """Write ``saved`` as the checkpoint ``stem``; returns the JSON path."""
    rounds = sorted(saved.in_flight, key=lambda r: r.group)
    record = {"format": CHECKPOINT_FORMAT, "config": saved.config, "homes": saved.homes, "clock": saved.clock,
              "state": saved.state, "in_flight": [r.info() for r in rounds]}
    weights = {"global": saved.global_weights, **{f"round{r.group}": r.weights for r in rounds},
               **{f"group{g}": w for g, w in saved.group_models.items()}}
    return save_checkpoint(stem, record, weights)


def load_loop(path: str | Path) -> LoopCheckpoint:
    """The :class:`LoopCheckpoint` at ``path``; a checkpoint of another layout is a UserError."""
    record, weights = load_checkpoint(path)
    if record.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"{path}: checkpoint format {record.get('format')} is not {CHECKPOINT_FORMAT}; it was "
                        "written by another version of ecofl")
    rounds = [GroupRound(**{**info, "homes": tuple(info["homes"])}, weights=weights[f"round{info['group']}"])
              for info in record["in_flight"]]
    groups = {int(name[len("group"):]): w for name, w in weights.items() if name.startswith("group")}
    return LoopCheckpoint(record["config"], record["homes"], record["clock"], record["state"], weights["global"],
                          rounds, groups)


def save_checkpoint(stem: Path, state: dict, weights: Mapping[str, Weights]) -> Path:
    """Write ``stem.npz`` (every weight list by name) and ``stem.json`` (``state``); returns the JSON path."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"{name}/{i}": np.asarray(a) for name, ws in weights.items() for i, a in enumerate(ws)}
    npz_tmp = stem.parent / (stem.name + ".tmp.npz")
    np.savez(npz_tmp, **arrays)
    os.replace(npz_tmp, stem.with_suffix(".npz"))
    write_json(stem.with_suffix(".json"), {**state, "weight_lists": {k: len(v) for k, v in weights.items()}})
    return stem.with_suffix(".json")


def load_checkpoint(path: str | Path) -> tuple[dict, dict[str, Weights]]:
    """Read a checkpoint written by :func:`save_checkpoint` from its ``.json`` or ``.npz`` path."""
    stem = Path(path).with_suffix("")
    json_path, npz_path = stem.with_suffix(".json"), stem.with_suffix(".npz")
    if not json_path.is_file() or not npz_path.is_file():
        raise UserError(f"no checkpoint at {stem} (need {json_path.name} and {npz_path.name})")
    state = json.loads(json_path.read_text())
    with np.load(npz_path, allow_pickle=False) as data:
        weights = {
            name: [data[f"{name}/{i}"] for i in range(count)] for name, count in state["weight_lists"].items()
        }
    return state, weights


GLOBAL_MODEL = "global_model.npz"  # what every run leaves in its output directory (ecofl.weights.save_weights)


def global_model_weights(path: str | Path) -> Weights:
    """The global model a run wrote: ``path`` is a run's output directory (its :data:`GLOBAL_MODEL`, else
    its newest checkpoint), a ``checkpoints`` directory, a checkpoint (``.json``/``.npz``) or a weights file."""
    from ecofl.weights import load_weights

    path = Path(path)
    if path.is_dir():
        if (path / GLOBAL_MODEL).is_file():
            return load_weights(path / GLOBAL_MODEL)
        found = sorted(path.glob("update_*.json")) or sorted((path / "checkpoints").glob("update_*.json"))
        if not found:
            raise UserError(f"no {GLOBAL_MODEL} or checkpoints/update_*.json in {path}")
        path = found[-1]
    if path.suffix == ".json" or path.with_suffix(".json").is_file():
        return load_checkpoint(path)[1]["global"]
    if not path.is_file():
        raise UserError(f"no model weights at {path}")
    return load_weights(path)
