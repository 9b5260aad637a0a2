"""A model as the ordered sequence of layers a pipeline planner cuts at.

Every model of :func:`ecofl.models.build_model` is a ``torch.nn.Sequential``
whose children are its natural *blocks* (stem, each inverted-residual / MBConv /
BasicBlock / Bottleneck / encoder layer, head pieces); every functional op of
the original forward (``torch.flatten``, global pooling) is an explicit module,
so running the children one after the other *is* the model.

Two granularities (the cut points of Asteroid §3 and Eco-FL §4.2):

- ``"block"``: the model's children;
- ``"fine"``: every container whose forward is purely sequential is flattened
  down to its leaves (conv, batch-norm, activation, pool, flatten, linear):
  ``nn.Sequential`` (and its subclasses such as torchvision's
  ``Conv2dNormActivation``), and an ``InvertedResidual`` / ``MBConv`` /
  ``FusedMBConv`` *without* its residual connection (its forward is then just
  its inner ``Sequential``); and a transformer encoder layer
  (``nn.TransformerEncoderLayer``) becomes two partition units, its attention
  and its MLP sub-layer, each with its residual and norm
  (:mod:`ecofl.models.transformer_units`, PipeEdge §III-C). Any other module
  with a skip connection (a residual block, squeeze-excitation's
  multiplicative gate) stays whole: cutting inside it would need a second
  tensor to travel between stages.

The returned modules are the model's own (parameters are shared, not copied),
except a transformer layer's two units: new modules that hold the layer's own
sub-modules, so their parameters are still the model's.
"""

from __future__ import annotations

from torch import nn

from ecofl import names
from ecofl.errors import UserError
from ecofl.models.transformer_units import encoder_layer_units

GRANULARITIES = names.GRANULARITIES


def named_layer_sequence(model: nn.Module, granularity: str = "block") -> list[tuple[str, nn.Module]]:
    """The ordered ``(dotted name, layer)`` pairs of ``model`` at ``granularity``.

    Names are the modules' paths in ``model.named_modules()`` (profiles and plan
    tables use them); a transformer layer's units are ``<path>[attention]`` and
    ``<path>[feed_forward]``.
    """
    if granularity not in GRANULARITIES:
        raise UserError(f"unknown granularity {granularity!r}; valid: {', '.join(GRANULARITIES)}")
    if not isinstance(model, nn.Sequential):
        raise UserError(
            f"{type(model).__name__} is not a layer sequence: build it with ecofl.models.build_model"
        )
    blocks = list(model.named_children())
    if granularity == "block":
        return blocks
    return [leaf for name, block in blocks for leaf in _flatten(name, block)]


def layer_sequence(model: nn.Module, granularity: str = "block") -> list[nn.Module]:
    """The ordered layers of ``model``; ``nn.Sequential(*layer_sequence(m, g))(x) == m(x)``."""
    return [layer for _, layer in named_layer_sequence(model, granularity)]


def _flatten(name: str, module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Leaves of ``module`` down through purely sequential containers; a transformer layer's two units."""
    if isinstance(module, nn.TransformerEncoderLayer):
        return encoder_layer_units(name, module)
    inner = _sequential_body(module)
    if inner is None:
        return [(name, module)]
    prefix = name if inner is module else f"{name}.{_child_name(module, inner)}"
    return [leaf for child_name, child in inner.named_children() for leaf in _flatten(f"{prefix}.{child_name}", child)]


def _sequential_body(module: nn.Module) -> nn.Sequential | None:
    """The ``Sequential`` that ``module.forward`` equals, or None if it has a skip or is a leaf."""
    if isinstance(module, nn.Sequential):
        return module
    if not type(module).__module__.startswith("torchvision."):
        return None
    from torchvision.models.efficientnet import FusedMBConv, MBConv  # loaded already: module is one of its models'
    from torchvision.models.mobilenetv2 import InvertedResidual

    if isinstance(module, InvertedResidual) and not module.use_res_connect:
        return module.conv  # torchvision mobilenetv2.py: forward is self.conv(x)
    if isinstance(module, (MBConv, FusedMBConv)) and not module.use_res_connect:
        return module.block  # torchvision efficientnet.py: forward is self.block(input)
    return None


def _child_name(parent: nn.Module, child: nn.Module) -> str:
    return next(name for name, module in parent.named_children() if module is child)
