"""How a home trains in a round: plain data, importable without torch (the home service's protocol carries it)."""

from __future__ import annotations

from dataclasses import dataclass

from ecofl.errors import UserError


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 1
    batch_size: int = 10
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    mu: float = 0.0  # FedProx proximal coefficient
    micro_batches: int = 1  # M: gradient accumulation steps per optimizer step
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 0 or self.batch_size < 1 or self.micro_batches < 1:
            raise UserError(f"invalid training config: {self}")
        if self.lr <= 0 or self.mu < 0:
            raise UserError(f"lr must be positive and mu non-negative: {self}")
