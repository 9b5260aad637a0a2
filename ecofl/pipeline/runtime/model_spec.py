"""What model a home trains, as data every device can rebuild on its own.

A worker on another device cannot receive a Python callable (nothing is
unpickled on the control channel), so the model is named by a JSON-able spec:

- :class:`ZooModel`: a model of :func:`ecofl.models.build_model`, cut into
  layers by :func:`ecofl.models.layer_sequence` at a granularity;
- :class:`LayerList`: an ``nn.Sequential`` of ``torch.nn`` classes by name
  and keyword arguments (tiny models for tests, synthetic workloads).

Every device builds the whole model and keeps its stage's layers; weights
come from the portal, so the random initialisation does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from torch import nn

from ecofl.errors import UserError


@dataclass(frozen=True)
class ZooModel:
    name: str
    input_shape: tuple[int, int, int]
    num_classes: int
    granularity: str = "block"
    options: dict[str, Any] = field(default_factory=dict)

    def build(self) -> tuple[nn.Module, list[nn.Module]]:
        from ecofl.models import build_model, layer_sequence  # torchvision: only when needed

        model = build_model(self.name, tuple(self.input_shape), self.num_classes, **self.options)
        return model, layer_sequence(model, self.granularity)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "zoo", "name": self.name, "input_shape": list(self.input_shape),
                "num_classes": self.num_classes, "granularity": self.granularity, "options": dict(self.options)}


@dataclass(frozen=True)
class LayerList:
    """``nn.Sequential(*(getattr(nn, cls)(**kwargs) for cls, kwargs in layers))``."""

    layers: tuple[tuple[str, dict[str, Any]], ...]

    def build(self) -> tuple[nn.Module, list[nn.Module]]:
        modules = []
        for cls_name, kwargs in self.layers:
            cls = getattr(nn, cls_name, None)
            if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
                raise UserError(f"{cls_name!r} is not a torch.nn module class")
            modules.append(cls(**kwargs))
        model = nn.Sequential(*modules)
        return model, list(model.children())

    def to_json(self) -> dict[str, Any]:
        return {"kind": "layers", "layers": [[name, dict(kwargs)] for name, kwargs in self.layers]}


ModelSpec = Union[ZooModel, LayerList]


def spec_from_json(data: dict[str, Any]) -> ModelSpec:
    """The spec :meth:`to_json` wrote."""
    if data.get("kind") == "zoo":
        return ZooModel(data["name"], tuple(data["input_shape"]), int(data["num_classes"]),
                        data.get("granularity", "block"), dict(data.get("options", {})))
    if data.get("kind") == "layers":
        return LayerList(tuple((str(name), dict(kwargs)) for name, kwargs in data["layers"]))
    raise ValueError(f"unknown model spec kind {data.get('kind')!r}")


def layer_state_keys(model: nn.Module, layers: list[nn.Module]) -> list[list[str]]:
    """For each layer, the keys of ``model.state_dict()`` it owns (parameters and buffers).

    Raises ValueError if a tensor is shared by two layers (a pipeline cut could
    separate them) or if some state belongs to no layer.
    """
    key_of = {id(t): k for k, t in model.state_dict(keep_vars=True).items()}
    owner: dict[str, int] = {}
    keys: list[list[str]] = []
    for index, layer in enumerate(layers):
        mine = []
        for tensor in layer.state_dict(keep_vars=True).values():
            key = key_of.get(id(tensor))
            if key is None:
                raise ValueError(f"layer {index} holds a tensor that is not in the model's state")
            if key in owner and owner[key] != index:
                raise ValueError(f"{key} is shared by layers {owner[key]} and {index}")
            if key not in owner:
                owner[key] = index
                mine.append(key)
        keys.append(mine)
    missing = set(key_of.values()) - set(owner)
    if missing:
        raise ValueError(f"model state outside every layer: {sorted(missing)}")
    return keys


def stage_module(layers: list[nn.Module], first: int, last: int) -> nn.Sequential:
    """The layers first..last (inclusive) as one module, sharing their parameters."""
    return nn.Sequential(*layers[first : last + 1])

