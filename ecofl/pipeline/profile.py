"""Per-layer profile of a model: what the planner and the cost model know of it.

Times are host seconds (one host core) per *micro-batch* at the measured batch
sizes; a device runs them ``1 / device.speed`` times as long (ecofl.devices).
The relation of time to batch size is not linear (Asteroid Fig. 6), so times
are interpolated piecewise-linearly between measured sizes and extrapolated
from the last two beyond them.

Byte counts are per *sample* unless named otherwise:

- ``activation_bytes[l]``: layer l's output (a_l, sent forward at a cut after l);
- ``gradient_bytes[l]``: the gradient w.r.t. layer l's input (b_l, sent backward
  at a cut before l);
- ``stash_bytes[l]``: what layer l keeps resident from its forward until its
  backward (saved tensors): ACT of Asteroid eq. 3 is the sum over a stage;
- ``weight_bytes[l]``, ``optimizer_bytes[l]``: per layer, not per sample
  (MOD and OPT of Asteroid eq. 3).

:func:`profile_model` measures a layer sequence on the host (one thread: one
host core is speed 1) and caches the result on disk; :func:`device_times`
scales a profile to a device.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ecofl.allocator import keep_freed_memory
from ecofl.devices import DeviceSpec
from ecofl.errors import UserError
from ecofl.models import GRANULARITIES, build_model, layer_sequence, named_layer_sequence


@dataclass(frozen=True)
class ModelProfile:
    """Measured or derived per-layer costs of one model (L layers, B batch sizes)."""

    model: str
    layer_names: tuple[str, ...]
    batch_sizes: tuple[int, ...]  # increasing, at least one
    forward_s: np.ndarray  # [L, B] host seconds per micro-batch of batch_sizes[b]
    backward_s: np.ndarray  # [L, B]
    activation_bytes: np.ndarray  # [L] per sample
    gradient_bytes: np.ndarray  # [L] per sample
    stash_bytes: np.ndarray  # [L] per sample
    weight_bytes: np.ndarray  # [L]
    optimizer_bytes: np.ndarray  # [L]
    flops: np.ndarray  # [L] forward FLOPs per sample
    input_bytes: int  # one input sample (what the portal sends to stage 0)
    optimizer_step_s: np.ndarray | None = None  # [L] host seconds of one optimizer step; None = free

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    def layer_times(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """Host forward and backward seconds of every layer for a micro-batch of ``batch``."""
        return _interpolate(self.batch_sizes, self.forward_s, batch), _interpolate(
            self.batch_sizes, self.backward_s, batch
        )


def device_times(profile: ModelProfile, device: DeviceSpec, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of every layer on ``device`` for a micro-batch of ``batch``.

    The host's interpolated times t_f^l(beta), t_b^l(beta) scaled by 1 / device.speed
    (Asteroid §3.3 profiles t_f^{d,l}(beta) on each device; we scale the host's).
    """
    forward, backward = profile.layer_times(batch)
    return forward / device.speed, backward / device.speed


def _interpolate(sizes: tuple[int, ...], times: np.ndarray, batch: int) -> np.ndarray:
    """Piecewise-linear in batch size through the measured points, linear beyond them."""
    if len(sizes) == 1:
        return times[:, 0] * (batch / sizes[0])
    x = np.asarray(sizes, dtype=float)
    i = int(np.clip(np.searchsorted(x, batch) - 1, 0, len(x) - 2))
    w = (batch - x[i]) / (x[i + 1] - x[i])
    return np.maximum(times[:, i] + w * (times[:, i + 1] - times[:, i]), 0.0)


DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
#: Bumped when what a profile measures changes, so older cached profiles are measured again.
PROFILE_METHOD = 2
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "ecofl" / "profiles"


def profile_model(
    layers: Sequence[nn.Module],
    input_shape: tuple[int, ...],
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    *,
    name: str,
    warmup: int = 2,
    repeats: int = 5,
    cache_dir: str | None = None,
    layer_names: Sequence[str] | None = None,
) -> ModelProfile:
    """Measure each layer of a sequence (layer l feeds layer l+1) on the host, or load it from the cache.

    ``input_shape`` is one sample's shape (no batch dimension). Times are the
    median of ``repeats`` runs after ``warmup`` runs, with one torch thread, of
    the layer's forward (in training mode) and of its backward from a random
    output gradient (parameter gradients and, except for layer 0, the input
    gradient). A layer timed alone, again and again, runs with its weights and
    activations warm in the caches; so at every batch size the layers' times
    are then scaled, forward and backward apart, to sum to one measured pass
    through the whole sequence (its median), which is how a stage runs them.
    Byte counts are per sample, taken at the largest batch size:

    - stash: storage of the tensors autograd saves for backward (hooked with
      ``torch.autograd.graph.saved_tensors_hooks``), deduplicated by storage,
      parameters excluded. A tensor saved by two adjacent layers (a ReLU's
      output that the next convolution saves as input) counts in both, so a
      stage's sum errs on the safe side;
    - weights: the layer's parameters (buffers are not counted);
    - optimizer state: SGD with momentum, one buffer per trainable parameter
      (1 x the trainable weights);
    - FLOPs: forward, as counted by ``torch.utils.flop_counter.FlopCounterMode``
      (matrix products and convolutions; element-wise ops count zero).

    The optimizer step of each layer (SGD with momentum, learning rate 0 so the
    weights do not change) is timed once. A layer that cannot run in training
    mode at some batch size (batch-norm over one value per channel at batch 1)
    is timed in evaluation mode at that size. The layers are left as found
    (training flags, buffers such as batch-norm statistics, no gradients). The cache key is the model name,
    the layers' structure, the input shape, the batch sizes and torch's
    version; the file is an ``.npz`` (no pickle) in ``cache_dir`` or
    ``~/.cache/ecofl/profiles``.
    """
    sizes = tuple(sorted(set(int(b) for b in batch_sizes)))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be positive integers, got {tuple(batch_sizes)}")
    if not layers:
        raise ValueError("cannot profile an empty layer sequence")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got {warmup}, {repeats}")
    names = tuple(layer_names) if layer_names is not None else tuple(
        f"{i}:{type(layer).__name__}" for i, layer in enumerate(layers)
    )
    if len(names) != len(layers):
        raise ValueError(f"{len(names)} layer names for {len(layers)} layers")
    path = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    path = path / f"{_safe(name)}-{_cache_key(name, layers, input_shape, sizes)}.npz"
    if path.exists():
        return load_profile(path)
    keep_freed_memory()  # as a worker does (ecofl.allocator): the steps timed allocate as the stages' will
    threads = torch.get_num_threads()
    modes = [layer.training for layer in layers]
    buffers = [[b.detach().clone() for b in layer.buffers()] for layer in layers]
    torch.set_num_threads(1)
    try:
        profile = _measure(list(layers), tuple(input_shape), sizes, name, names, warmup, repeats)
    finally:
        torch.set_num_threads(threads)
        for layer, mode, saved in zip(layers, modes, buffers):
            layer.train(mode)
            for p in layer.parameters():
                p.grad = None
            with torch.no_grad():  # batch-norm statistics moved while measuring
                for b, value in zip(layer.buffers(), saved):
                    b.copy_(value)
    save_profile(profile, path)
    return profile


def save_profile(profile: ModelProfile, path: str | os.PathLike) -> None:
    """Write a profile as ``.npz`` (arrays plus a JSON header, no pickle), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        f.name: np.asarray(getattr(profile, f.name), dtype=float)
        for f in fields(profile)
        if isinstance(getattr(profile, f.name), np.ndarray)
    }
    meta = {
        "model": profile.model,
        "layer_names": list(profile.layer_names),
        "batch_sizes": list(profile.batch_sizes),
        "input_bytes": profile.input_bytes,
    }
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as handle:
        np.savez(handle, meta=np.array(json.dumps(meta)), **arrays)
    os.replace(handle.name, path)


def load_profile(path: str | os.PathLike) -> ModelProfile:
    """Read a profile written by :func:`save_profile`."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        arrays = {key: data[key] for key in data.files if key != "meta"}
    return ModelProfile(
        model=meta["model"],
        layer_names=tuple(meta["layer_names"]),
        batch_sizes=tuple(meta["batch_sizes"]),
        input_bytes=int(meta["input_bytes"]),
        **arrays,
    )


def _measure(
    layers: list[nn.Module],
    input_shape: tuple[int, ...],
    sizes: tuple[int, ...],
    name: str,
    names: tuple[str, ...],
    warmup: int,
    repeats: int,
) -> ModelProfile:
    count = len(layers)
    forward = np.zeros((count, len(sizes)))
    backward = np.zeros((count, len(sizes)))
    generator = torch.Generator().manual_seed(0)
    bar = tqdm(total=len(sizes) * count, desc=f"profiling {name} on this host (once; cached)", unit="layer",
               disable=None, leave=False)  # on a terminal only
    for column, batch in enumerate(sizes):
        x = torch.randn((batch, *input_shape), generator=generator)
        bar.set_postfix(batch=batch, refresh=False)
        for l, layer in enumerate(layers):
            layer.train()
            x = _trainable_input(x, l)
            _fit_mode(layer, x)
            forward[l, column], backward[l, column], y = _time_layer(layer, x, warmup, repeats)
            x = y.detach()
            bar.update()
        whole_forward, whole_backward = _time_pass(layers, torch.randn((batch, *input_shape), generator=generator),
                                                   warmup, repeats)
        forward[:, column] *= whole_forward / forward[:, column].sum()
        if backward[:, column].sum() > 0:
            backward[:, column] *= whole_backward / backward[:, column].sum()
    bar.close()
    activation, gradient, stash, flops = (np.zeros(count) for _ in range(4))
    batch = sizes[-1]
    x = torch.randn((batch, *input_shape), generator=generator)
    input_bytes = x[0].numel() * x.element_size()
    for l, layer in enumerate(layers):
        layer.train()
        x = _trainable_input(x, l)
        _fit_mode(layer, x)
        with FlopCounterMode(display=False) as counter:
            layer(x)
        y, stash[l] = _stashed(layer, x)
        flops[l] = counter.get_total_flops() / batch
        activation[l] = y.numel() * y.element_size() / batch
        gradient[l] = x.numel() * x.element_size() / batch if x.is_floating_point() else 0.0
        x = y.detach()
    params = [list(layer.parameters()) for layer in layers]
    weight = np.array([sum(p.numel() * p.element_size() for p in ps) for ps in params], dtype=float)
    optimizer = np.array(
        [sum(p.numel() * p.element_size() for p in ps if p.requires_grad) for ps in params], dtype=float
    )
    return ModelProfile(
        model=name,
        layer_names=names,
        batch_sizes=sizes,
        forward_s=forward,
        backward_s=backward,
        activation_bytes=activation,
        gradient_bytes=gradient,
        stash_bytes=stash,
        weight_bytes=weight,
        optimizer_bytes=optimizer,
        flops=flops,
        input_bytes=int(input_bytes),
        optimizer_step_s=np.array([_time_step(ps, warmup, repeats) for ps in params]),
    )


def _trainable_input(x: torch.Tensor, index: int) -> torch.Tensor:
    """A stage boundary: the input needs its gradient, except the model's input (layer 0)."""
    x = x.detach()
    return x.requires_grad_(index > 0 and x.is_floating_point())


def _fit_mode(layer: nn.Module, x: torch.Tensor) -> None:
    """Switch to eval mode if the layer cannot train on this batch (batch-norm at batch 1)."""
    try:
        with torch.no_grad():
            layer(x)
    except ValueError:
        layer.eval()


def _time_layer(layer: nn.Module, x: torch.Tensor, warmup: int, repeats: int) -> tuple[float, float, torch.Tensor]:
    """Median forward and backward seconds, and the layer's output."""
    forward_times, backward_times = [], []
    for run in range(warmup + repeats):
        start = time.perf_counter()
        y = layer(x)
        forward_s = time.perf_counter() - start
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"layer {type(layer).__name__} returns {type(y).__name__}, not one tensor")
        backward_s = 0.0
        if y.requires_grad:
            grad = torch.ones_like(y)
            start = time.perf_counter()
            torch.autograd.backward(y, grad)
            backward_s = time.perf_counter() - start
        if run >= warmup:
            forward_times.append(forward_s)
            backward_times.append(backward_s)
    return statistics.median(forward_times), statistics.median(backward_times), y


def _stashed(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The layer's output and the bytes per sample it saves for backward (deduplicated by storage)."""
    own = {t.untyped_storage().data_ptr() for t in layer.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in own:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        y = layer(x)
    return y, sum(saved.values()) / x.shape[0]


def _time_step(params: list[nn.Parameter], warmup: int, repeats: int) -> float:
    """Median seconds of an SGD-with-momentum step over these parameters (lr 0: weights unchanged)."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        return 0.0
    for p in trainable:
        p.grad = torch.ones_like(p)
    optimizer = torch.optim.SGD(trainable, lr=0.0, momentum=0.9)
    times = []
    for run in range(warmup + repeats):
        start = time.perf_counter()
        optimizer.step()
        if run >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _time_pass(layers: list[nn.Module], x: torch.Tensor, warmup: int, repeats: int) -> tuple[float, float]:
    """Median seconds of one forward through all the layers and of its backward (from a ones gradient)."""
    forward_times, backward_times = [], []
    for run in range(warmup + repeats):
        start = time.perf_counter()
        y = x
        for l, layer in enumerate(layers):
            y = layer(_trainable_input(y, l) if l == 0 else y)
        forward_s = time.perf_counter() - start
        start = time.perf_counter()
        if y.requires_grad:
            torch.autograd.backward(y, torch.ones_like(y))
        backward_s = time.perf_counter() - start
        if run >= warmup:
            forward_times.append(forward_s)
            backward_times.append(backward_s)
    return statistics.median(forward_times), statistics.median(backward_times)


def _cache_key(name: str, layers: Sequence[nn.Module], input_shape: tuple[int, ...], sizes: tuple[int, ...]) -> str:
    structure = [
        (repr(layer), [(n, tuple(p.shape), str(p.dtype)) for n, p in layer.named_parameters()]) for layer in layers
    ]
    text = json.dumps([PROFILE_METHOD, name, structure, list(input_shape), list(sizes), torch.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def profile_zoo_model(
    model: str, input_shape: tuple[int, int, int], classes: int, granularity: str, cache_dir: str | None = None
) -> ModelProfile:
    """The host profile of a zoo model's layer sequence (cached on disk)."""
    if granularity not in GRANULARITIES:
        raise UserError(f"unknown granularity {granularity!r}; valid: {', '.join(GRANULARITIES)}")
    network = build_model(model, input_shape, classes)
    named = named_layer_sequence(network, granularity)
    shape = "x".join(map(str, input_shape))
    return profile_model(
        layer_sequence(network, granularity), input_shape, name=f"{model}-{granularity}-{shape}-{classes}",
        cache_dir=cache_dir, layer_names=[name for name, _ in named],
    )
