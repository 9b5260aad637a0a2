"""Shared test settings: one torch thread (the machine has two cores, shared)."""

import torch

torch.set_num_threads(1)
