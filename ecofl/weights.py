"""A model's state as a list of numpy arrays (Flower's ``ArrayRecord`` order), and back.

The list holds every entry of ``state_dict()`` in order: parameters and
buffers (batch-norm running statistics travel with the model, as in Flower's
PyTorch examples).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ecofl.accelerator import host_array

Weights = list[np.ndarray]


def get_weights(model: torch.nn.Module) -> Weights:
    return [host_array(value).copy() for value in model.state_dict().values()]


def set_weights(model: torch.nn.Module, weights: Weights) -> None:
    """Load ``weights`` into ``model``; a wrong count or shape is a ValueError naming the entry."""
    state = model.state_dict()
    if len(weights) != len(state):
        raise ValueError(f"expected {len(state)} arrays, got {len(weights)}")
    new_state = {}
    for (name, current), array in zip(state.items(), weights):
        if tuple(array.shape) != tuple(current.shape):
            raise ValueError(f"{name}: expected shape {tuple(current.shape)}, got {tuple(array.shape)}")
        new_state[name] = torch.as_tensor(np.asarray(array), dtype=current.dtype)
    model.load_state_dict(new_state, strict=True)


def save_weights(path: str | Path, weights: Weights) -> Path:
    """Write ``weights`` to ``path`` (``.npz``, one array per state entry in order, no pickle), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp.npz")
    np.savez(partial, **{f"{i:04d}": np.asarray(w) for i, w in enumerate(weights)})
    os.replace(partial, path)
    return path


def load_weights(path: str | Path) -> Weights:
    """The weights :func:`save_weights` wrote."""
    with np.load(path, allow_pickle=False) as data:
        return [data[key] for key in sorted(data.files)]
