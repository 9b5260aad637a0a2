"""The model zoo: names, option checking and construction."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from ecofl import names
from ecofl.errors import UserError
from ecofl.models.bert import bert_small
from ecofl.models.cnn import fedavg_cnn
from ecofl.models.torchvision_models import torchvision_builders

_BUILDERS: dict[str, Callable[..., nn.Sequential]] = {
    "cnn": fedavg_cnn,
    **torchvision_builders(),
    "bert_small": bert_small,
}

MODELS = names.MODELS
"""Every registered model name, in registration order (tests/test_cli.py: exactly the zoo's)."""


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int, **options: object) -> nn.Module:
    """A fresh, randomly initialised model ``name`` for inputs (C, H, W) and ``num_classes`` outputs.

    The result is an ``nn.Sequential`` of its blocks (see :mod:`ecofl.models.layers`).
    Raises :class:`ecofl.errors.UserError` for an unknown name, a bad shape or a bad option.
    """
    if name not in _BUILDERS:
        raise UserError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    builder = _BUILDERS[name]
    shape = tuple(input_shape)
    if len(shape) != 3 or not all(isinstance(d, int) and d > 0 for d in shape):
        raise UserError(f"{name}: input_shape must be three positive integers (C, H, W), got {input_shape!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise UserError(f"{name}: num_classes must be a positive integer, got {num_classes!r}")
    valid = model_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        allowed = ", ".join(valid) or "none"
        raise UserError(f"{name}: unknown option(s) {', '.join(unknown)}; valid options: {allowed}")
    return builder(shape, num_classes, **options)


def model_options(name: str) -> dict[str, object]:
    """The options model ``name`` accepts, with their defaults."""
    if name not in _BUILDERS:
        raise UserError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    parameters = inspect.signature(_BUILDERS[name]).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
