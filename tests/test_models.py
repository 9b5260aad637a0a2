"""ecofl.models: every model is a layer sequence that equals its forward, at both granularities."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn
from torchvision.models.efficientnet import MBConv

from ecofl.errors import UserError
from ecofl.models import GRANULARITIES, MODELS, build_model, layer_sequence, model_options, named_layer_sequence
from ecofl.models.transformer_units import FeedForwardUnit, SelfAttentionUnit
from ecofl.pipeline.runtime.model_spec import layer_state_keys

SHAPE = (3, 32, 32)
CONF = Path(__file__).resolve().parents[1] / "conf" / "model"

# The counts documented in ecofl/models/__init__.py (default options).
LAYER_COUNTS = {
    "cnn": (5, 10),
    "mobilenet_v2": (22, 73),
    "efficientnet_b0": (21, 79),
    "efficientnet_b1": (28, 86),
    "efficientnet_b2": (28, 86),
    "efficientnet_b3": (31, 89),
    "efficientnet_b4": (37, 95),
    "efficientnet_b5": (44, 102),
    "efficientnet_b6": (50, 108),
    "efficientnet_b7": (60, 118),
    "resnet18": (12, 14),
    "resnet50": (20, 22),
    "bert_small": (7, 18),
}


@pytest.fixture(scope="module")
def zoo() -> dict[str, nn.Module]:
    """Every registered model, built once for 3x32x32 inputs and 10 classes, in eval mode.

    Fresh batch-norm statistics (mean 0, variance 1) let activations of a deep
    network vanish (MobileNetV2's outputs are ~1e-9), which would make any
    comparison at atol 1e-5 vacuous: the statistics are set from one batch.
    """
    torch.manual_seed(0)
    return {name: _calibrated(build_model(name, SHAPE, 10)) for name in MODELS}


def _calibrated(model: nn.Module) -> nn.Module:
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average: after one batch, that batch's statistics
    with torch.no_grad():
        model.train()(torch.randn(8, *SHAPE))
    for norm in norms:
        norm.momentum = 0.1
    return model.eval()


def _ptrs(modules: list[nn.Module]) -> set[int]:
    return {p.data_ptr() for m in modules for p in m.parameters()}


@pytest.mark.parametrize("name", MODELS)
def test_layer_sequence_equals_forward_in_eval(zoo: dict[str, nn.Module], name: str) -> None:
    model = zoo[name].eval()
    x = torch.randn(2, *SHAPE)
    with torch.no_grad():
        expected = model(x)
        assert expected.std() > 1e-3  # not vanished: atol 1e-5 tells outputs apart
        for granularity in GRANULARITIES:
            got = nn.Sequential(*layer_sequence(model, granularity))(x)
            assert torch.allclose(got, expected, atol=1e-5), granularity


@pytest.mark.parametrize("name", MODELS)
def test_layer_sequence_shares_parameters(zoo: dict[str, nn.Module], name: str) -> None:
    model = zoo[name]
    params = list(model.parameters())
    for granularity in GRANULARITIES:
        layers = layer_sequence(model, granularity)
        assert sum(p.numel() for m in layers for p in m.parameters()) == sum(p.numel() for p in params)
        assert _ptrs(layers) == {p.data_ptr() for p in params}


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_b0", "bert_small"])
def test_layer_sequence_equals_forward_in_train(zoo: dict[str, nn.Module], name: str) -> None:
    """Batch-norm on batch statistics; dropout and stochastic depth drawn from the same seed."""
    model = zoo[name].train()
    x = torch.randn(2, *SHAPE)
    try:
        with torch.no_grad():
            torch.manual_seed(1)
            expected = model(x)
            assert expected.std() > 1e-3
            for granularity in GRANULARITIES:
                torch.manual_seed(1)
                got = nn.Sequential(*layer_sequence(model, granularity))(x)
                assert torch.allclose(got, expected, atol=1e-5), granularity
    finally:
        model.eval()


@pytest.mark.parametrize("name", ["resnet18", "efficientnet_b0", "mobilenet_v2", "bert_small"])
def test_every_fine_layer_can_start_a_stage(zoo: dict[str, nn.Module], name: str) -> None:
    """A stage's input is a leaf that requires grad: no layer may modify its input in place."""
    model = zoo[name].train()
    try:
        x = torch.randn(2, *SHAPE)
        for layer in layer_sequence(model, "fine"):
            x = layer(x.detach().requires_grad_())
            x.sum().backward()
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


@pytest.mark.parametrize("name", MODELS)
def test_documented_layer_counts(zoo: dict[str, nn.Module], name: str) -> None:
    counts = tuple(len(layer_sequence(zoo[name], g)) for g in GRANULARITIES)
    assert counts == LAYER_COUNTS[name]


def test_efficientnet_b1_fine_flattens_only_blocks_without_skip(zoo: dict[str, nn.Module]) -> None:
    model = zoo["efficientnet_b1"]
    block, fine = layer_sequence(model, "block"), layer_sequence(model, "fine")
    assert len(fine) > len(block)
    residual = [m for m in model.modules() if isinstance(m, MBConv) and m.use_res_connect]
    plain = [m for m in model.modules() if isinstance(m, MBConv) and not m.use_res_connect]
    assert len(residual) == 16 and len(plain) == 7
    assert all(any(layer is r for layer in fine) for r in residual)
    assert not any(isinstance(layer, nn.Sequential) or layer in plain for layer in fine)


def test_fine_names_are_module_paths(zoo: dict[str, nn.Module]) -> None:
    model = zoo["mobilenet_v2"]
    modules = dict(model.named_modules())
    for name, layer in named_layer_sequence(model, "fine"):
        assert modules[name] is layer


def test_bert_fine_cuts_each_encoder_layer_between_attention_and_mlp(zoo: dict[str, nn.Module]) -> None:
    model = zoo["bert_small"]
    named = named_layer_sequence(model, "fine")
    units = [(name, layer) for name, layer in named if isinstance(layer, (SelfAttentionUnit, FeedForwardUnit))]
    assert [name for name, _ in units] == [
        f"encoder{i}[{part}]" for i in range(4) for part in ("attention", "feed_forward")
    ]
    assert not any(isinstance(layer, nn.TransformerEncoderLayer) for _, layer in named)
    modules = dict(model.named_modules())
    for i in range(4):  # each unit holds its sub-layer's own modules, with its residual's norm
        attention, feed_forward = units[2 * i][1], units[2 * i + 1][1]
        assert (attention.self_attn is modules[f"encoder{i}.self_attn"]
                and attention.norm1 is modules[f"encoder{i}.norm1"])
        assert (feed_forward.linear1 is modules[f"encoder{i}.linear1"]
                and feed_forward.norm2 is modules[f"encoder{i}.norm2"])
    keys = layer_state_keys(model, [layer for _, layer in named])  # the runtime's ownership: disjoint, complete
    owned = dict(zip((name for name, _ in named), keys))
    assert owned["encoder0[attention]"] and all(k.startswith("encoder0.") for k in owned["encoder0[attention]"])
    assert {k.split(".")[1] for k in owned["encoder0[feed_forward]"]} == {"linear1", "linear2", "norm2"}


def test_bert_sublayer_cut_equals_forward_and_gradients() -> None:
    """Train mode without dropout (deterministic): outputs and every parameter's gradient match."""
    torch.manual_seed(3)
    model = build_model("bert_small", SHAPE, 10, layers=2, dropout=0.0).train()
    x = torch.randn(4, *SHAPE)
    target = torch.randint(0, 10, (4,))
    expected = model(x)
    nn.functional.cross_entropy(expected, target).backward()
    reference = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    fine = layer_sequence(model, "fine")
    assert sum(isinstance(layer, SelfAttentionUnit) for layer in fine) == 2
    got = nn.Sequential(*fine)(x)
    nn.functional.cross_entropy(got, target).backward()
    assert torch.allclose(got, expected, atol=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, reference[name], atol=1e-5, rtol=1e-4), name


def test_pre_norm_encoder_layers_are_cut_too() -> None:
    torch.manual_seed(4)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=True)
    model = nn.Sequential(nn.Linear(8, 16), layer, nn.Flatten())
    fine = layer_sequence(model, "fine")
    assert [type(m) for m in fine] == [nn.Linear, SelfAttentionUnit, FeedForwardUnit, nn.Flatten]
    x = torch.randn(3, 5, 8)
    assert torch.allclose(nn.Sequential(*fine)(x), model(x), atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_cnn_handles_input_shapes(shape: tuple[int, int, int]) -> None:
    model = build_model("cnn", shape, 10).eval()
    with torch.no_grad():
        assert model(torch.randn(2, *shape)).shape == (2, 10)


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_b0", "resnet18", "bert_small"])
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28)])
def test_models_handle_small_one_channel_inputs(name: str, shape: tuple[int, int, int]) -> None:
    options = {"width": 0.25} if name == "mobilenet_v2" else {}
    model = build_model(name, shape, 7, **options).eval()
    with torch.no_grad():
        assert model(torch.randn(2, *shape)).shape == (2, 7)


def test_small_inputs_downsample_by_8_and_large_by_32() -> None:
    def features(shape: tuple[int, int, int]) -> torch.Size:
        model = build_model("resnet18", shape, 10).eval()
        with torch.no_grad():
            return nn.Sequential(*list(model)[:-3])(torch.randn(1, *shape)).shape[-2:]

    assert features((3, 32, 32)) == (4, 4)
    assert features((3, 64, 64)) == (2, 2)


def test_mobilenet_width_scales_parameters() -> None:
    narrow = build_model("mobilenet_v2", SHAPE, 10, width=0.5)
    wide = build_model("mobilenet_v2", SHAPE, 10, width=1.0)
    assert sum(p.numel() for p in narrow.parameters()) < sum(p.numel() for p in wide.parameters())


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(UserError) as error:
        build_model("vgg16", SHAPE, 10)
    assert all(name in str(error.value) for name in MODELS)


@pytest.mark.parametrize(
    ("name", "options", "shape"),
    [
        ("cnn", {"width": 2.0}, SHAPE),
        ("mobilenet_v2", {"width": 0.0}, SHAPE),
        ("bert_small", {"patch": 5}, SHAPE),
        ("bert_small", {"hidden": 30, "heads": 4}, SHAPE),
        ("cnn", {}, (1, 2, 2)),
        ("resnet18", {}, (3, 32)),
    ],
)
def test_bad_options_and_shapes_are_user_errors(name: str, options: dict, shape: tuple) -> None:
    with pytest.raises(UserError):
        build_model(name, shape, 10, **options)


def test_layer_sequence_rejects_bad_input(zoo: dict[str, nn.Module]) -> None:
    with pytest.raises(UserError, match="block, fine"):
        layer_sequence(zoo["cnn"], "coarse")
    with pytest.raises(UserError, match="build_model"):
        layer_sequence(nn.LSTM(4, 4))


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_model_configs_build(path: Path) -> None:
    conf = OmegaConf.to_container(OmegaConf.load(path))
    assert conf["name"] == path.stem
    assert set(conf["options"]) <= set(model_options(conf["name"]))
    model = build_model(conf["name"], (1, 28, 28), 10, **conf["options"]).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_configs_cover_the_main_models() -> None:
    expected = {"cnn", "mobilenet_v2", "efficientnet_b1", "resnet18", "resnet50", "bert_small"}
    assert expected <= {p.stem for p in CONF.glob("*.yaml")}
