"""Weight versions of one stage under asynchronous 1F1B: PipeDream's weight stashing, FTPipeHD's aggregation.

Asynchronous 1F1B (FTPipeHD §III-C) updates a stage's weights after every
backward, while S - s micro-batches are in flight on stage s. So a
micro-batch's backward may run after later micro-batches' updates changed
the weights its forward used. **Weight stashing** keeps, for every
micro-batch in flight, the version of the weights its forward saw: the
forward runs on a copy of that version (``torch.func.functional_call``), so
autograd's graph holds the copy, and the backward computes the gradient at
that version, which the optimizer then applies to the current weights
(PipeDream's update rule: w_{t+1} = w_t - lr * grad f(w_{stashed})).
Micro-batches whose forwards saw the same version share one copy.

**Weight aggregation** (FTPipeHD §III-C): stage s trains, in effect, S - s
concurrent models (its updates come from gradients at S - s different stale
versions), so every so often its weights become the mean of its last S - s
versions. Buffers (batch-norm statistics) are not versioned: they are the
module's own.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import nn
from torch.func import functional_call


class WeightVersions:
    """The stashed and recent weight versions of one stage (``keep`` = S - s)."""

    def __init__(self, module: nn.Module, keep: int):
        self.module, self.keep = module, keep
        self.names = [name for name, _ in module.named_parameters()]
        self.params = [p for _, p in module.named_parameters()]
        self.version = 0  # updates applied so far
        self._stash: dict[int, list[torch.Tensor]] = {}  # version -> its copy (leaves that collect gradients)
        self._used_by: dict[int, int] = {}  # micro-batch in flight -> the version its forward used
        self._recent: deque[list[torch.Tensor]] = deque(maxlen=keep)  # the last ``keep`` versions, newest last
        # (micro-batch, the version its forward and backward used, the current version at its backward)
        self.log: list[tuple[int, int, int]] = []

    def current(self) -> list[torch.Tensor]:
        """The stashed copy of the current version (made on first use), what the next forward runs on."""
        if self.version not in self._stash:
            self._stash[self.version] = [p.detach().clone().requires_grad_(p.requires_grad) for p in self.params]
        return self._stash[self.version]

    def forward(self, x: torch.Tensor, m: int) -> torch.Tensor:
        """The stage's forward of micro-batch ``m`` on the stashed copy of the current version."""
        self._used_by[m] = self.version
        return functional_call(self.module, dict(zip(self.names, self.current())), (x,))

    def gradients(self, m: int) -> list[torch.Tensor | None]:
        """After micro-batch ``m``'s backward: its gradient, taken at the version its forward used."""
        version = self._used_by.pop(m)
        stash = self._stash[version]
        grads = [t.grad for t in stash]
        for t in stash:
            t.grad = None
        self.log.append((m, version, self.version))
        if version not in self._used_by.values() and version != self.version:
            del self._stash[version]  # no micro-batch in flight uses it, and no new forward will
        return grads

    def stepped(self) -> None:
        """The optimizer updated the weights: a new version, remembered for aggregation."""
        self._new_version()
        self._recent.append([p.detach().clone() for p in self.params])

    def aggregate(self) -> None:
        """FTPipeHD's aggregation: the weights become the mean of the last ``keep`` versions, a version of
        their own (FTPipeHD Fig. 2: versions 1-3 averaged make version 4); later ones are averaged next time."""
        if len(self._recent) < 2:
            return
        with torch.no_grad():
            for i, p in enumerate(self.params):
                p.copy_(torch.stack([version[i] for version in self._recent]).mean(0))
        self._recent.clear()
        self._new_version()

    def _new_version(self) -> None:
        if self.version not in self._used_by.values():
            self._stash.pop(self.version, None)  # no forward in flight used it, and no new forward will
        self.version += 1

    def nbytes(self) -> int:
        """The memory this keeps beside the stage's own weights, at most: ``keep`` stashed and ``keep`` recent
        versions (the cost model's :func:`ecofl.pipeline.memory_model.weight_versions_bytes`)."""
        return 2 * self.keep * sum(p.numel() * p.element_size() for p in self.params)
