"""Per-layer profiles: interpolation, device scaling, host measurement, disk cache."""

import numpy as np
import pytest
import torch
from torch import nn

from ecofl.devices import preset
from ecofl.pipeline import profile as profile_module
from ecofl.pipeline.profile import ModelProfile, device_times, load_profile, profile_model, save_profile

SIZES = (1, 2, 4)


def tiny_layers() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.Conv2d(3, 4, 3, padding=1),  # 0: saves its input
        nn.BatchNorm2d(4),  # 1
        nn.ReLU(),  # 2: saves its output
        nn.Flatten(),  # 3: a view, saves nothing
        nn.Linear(4 * 6 * 6, 5),  # 4
        nn.BatchNorm1d(5),  # 5: cannot train at batch 1
    ]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    layers = tiny_layers()
    cache = tmp_path_factory.mktemp("profiles")
    return layers, cache, profile_model(layers, (3, 6, 6), SIZES, name="tiny", warmup=1, repeats=2,
                                        cache_dir=str(cache))


def table_profile(forward: list[list[float]], sizes: tuple[int, ...]) -> ModelProfile:
    times = np.array(forward)
    zeros = np.zeros(len(times))
    return ModelProfile("t", tuple(f"l{i}" for i in range(len(times))), sizes, times, 2 * times,
                        zeros, zeros, zeros, zeros, zeros, zeros, 0)


def test_interpolation_is_piecewise_linear_and_extrapolates():
    profile = table_profile([[1.0, 2.0, 6.0]], (1, 2, 4))
    assert profile.layer_times(2)[0][0] == pytest.approx(2.0)
    assert profile.layer_times(3)[0][0] == pytest.approx(4.0)  # between 2 and 4
    assert profile.layer_times(8)[0][0] == pytest.approx(14.0)  # beyond: slope of the last segment
    assert profile.layer_times(3)[1][0] == pytest.approx(8.0)  # backward table too
    single = table_profile([[3.0]], (4,))
    assert single.layer_times(2)[0][0] == pytest.approx(1.5)


def test_device_times_scale_by_speed():
    profile = table_profile([[1.0, 2.0], [0.5, 1.0]], (1, 2))
    nano = preset("nano-10w")
    forward, backward = device_times(profile, nano, 2)
    assert forward == pytest.approx(np.array([2.0, 1.0]) / nano.speed)
    assert backward == pytest.approx(2 * forward)


def test_profile_shapes_and_times(tiny):
    layers, _, profile = tiny
    assert profile.num_layers == len(layers)
    assert profile.batch_sizes == SIZES
    assert profile.forward_s.shape == profile.backward_s.shape == (len(layers), len(SIZES))
    assert (profile.forward_s > 0).all()
    assert (profile.backward_s > 0).all()  # layer 0: parameter gradients only
    assert profile.layer_names[0] == "0:Conv2d"


def test_profile_bytes_and_flops(tiny):
    layers, _, profile = tiny
    weights = [sum(p.numel() * 4 for p in layer.parameters()) for layer in layers]
    assert profile.weight_bytes.tolist() == weights
    assert profile.optimizer_bytes.tolist() == weights  # SGD momentum: one buffer per weight
    assert profile.input_bytes == 3 * 6 * 6 * 4
    assert profile.activation_bytes.tolist() == [4 * 36 * 4] * 4 + [5 * 4] * 2
    assert profile.gradient_bytes[1] == 4 * 36 * 4
    stash = profile.stash_bytes
    assert stash[0] >= 3 * 36 * 4 and stash[2] >= 4 * 36 * 4 and stash[4] >= 4 * 36 * 4
    assert stash[3] == 0
    assert profile.flops[4] == 2 * 144 * 5
    assert profile.flops[0] == 2 * 36 * 4 * 27
    assert profile.optimizer_step_s is not None and profile.optimizer_step_s[0] > 0
    assert profile.optimizer_step_s[2] == 0


def test_profiling_leaves_the_layers_as_found(tiny):
    layers, _, _ = tiny
    assert all(layer.training for layer in layers)
    assert all(p.grad is None for layer in layers for p in layer.parameters())
    assert torch.equal(layers[1].running_mean, torch.zeros(4))
    assert int(layers[1].num_batches_tracked) == 0
    fresh = tiny_layers()
    assert torch.equal(layers[0].weight, fresh[0].weight)


def test_cache_hit_returns_equal_profile_without_measuring(tiny, monkeypatch):
    layers, cache, profile = tiny

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(profile_module, "_measure", no_measuring)
    again = profile_model(layers, (3, 6, 6), SIZES, name="tiny", warmup=1, repeats=2, cache_dir=str(cache))
    assert_same(again, profile)
    assert len(list(cache.glob("tiny-*.npz"))) == 1
    with pytest.raises(AssertionError, match="measured again"):  # other batch sizes: another key
        profile_model(layers, (3, 6, 6), (2, 4), name="tiny", cache_dir=str(cache))


def test_save_and_load_round_trip(tiny, tmp_path):
    _, _, profile = tiny
    save_profile(profile, tmp_path / "p.npz")
    assert_same(load_profile(tmp_path / "p.npz"), profile)


def test_bad_arguments():
    with pytest.raises(ValueError):
        profile_model([], (3,), name="empty")
    with pytest.raises(ValueError):
        profile_model([nn.ReLU()], (3,), (0, 2), name="zero")


def assert_same(a: ModelProfile, b: ModelProfile) -> None:
    assert ((a.model, a.layer_names, a.batch_sizes, a.input_bytes)
            == (b.model, b.layer_names, b.batch_sizes, b.input_bytes))
    for name in ("forward_s", "backward_s", "activation_bytes", "gradient_bytes", "stash_bytes",
                 "weight_bytes", "optimizer_bytes", "flops", "optimizer_step_s"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_transformer_sublayer_units_are_profiled_as_layers(tmp_path):
    """PipeEdge §III-C's units: an encoder layer's attention and MLP are two layers with their own costs."""
    from ecofl.models import build_model, named_layer_sequence

    model = build_model("bert_small", (1, 8, 8), 10, layers=2, hidden=32, heads=2)
    named = named_layer_sequence(model, "fine")
    profile = profile_model([layer for _, layer in named], (1, 8, 8), (1, 2), name="bert-units", warmup=0,
                            repeats=1, cache_dir=str(tmp_path), layer_names=[name for name, _ in named])
    index = {name: i for i, name in enumerate(profile.layer_names)}
    attention, mlp = index["encoder0[attention]"], index["encoder0[feed_forward]"]
    assert mlp == attention + 1
    params = dict(model.named_parameters())
    own = lambda prefix, parts: sum(p.numel() * 4 for n, p in params.items()  # noqa: E731
                                    if n.startswith(prefix) and n.split(".")[1] in parts)
    assert profile.weight_bytes[attention] == own("encoder0.", {"self_attn", "norm1"})
    assert profile.weight_bytes[mlp] == own("encoder0.", {"linear1", "linear2", "norm2"})
    assert profile.weight_bytes.sum() == sum(p.numel() * 4 for p in params.values())
    tokens = (8 // 4) ** 2 + 1  # 2x2 patches and [CLS], hidden 32, float32
    assert profile.activation_bytes[attention] == profile.activation_bytes[mlp] == tokens * 32 * 4
    assert profile.flops[attention] > 0 and profile.flops[mlp] > 0
    assert (profile.forward_s[[attention, mlp]] > 0).all() and profile.stash_bytes[attention] > 0
