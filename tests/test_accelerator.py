"""Where tensors live: the device setting, its checks, and the simulation's actors for it."""

from __future__ import annotations

import pytest
import torch

from ecofl.accelerator import check_device_spec, device_label, resolve_device
from ecofl.errors import UserError
from server.config import SimulationSettings, experiment

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


@pytest.mark.parametrize("spec", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_settings_spelled_right_pass(spec):
    assert check_device_spec(spec) == spec


@pytest.mark.parametrize("spec", ["gpu", "CUDA", "cuda:", "cuda:x", "mps", "", None, 0])
def test_device_settings_spelled_wrong_name_the_choices(spec):
    with pytest.raises(UserError, match="simulation.device must be one of auto, cpu, cuda, cuda:N"):
        check_device_spec(spec, "simulation.device")


@no_gpu
def test_auto_without_a_gpu_is_the_cpu():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert device_label(resolve_device("auto")) == "cpu"


@no_gpu
@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_an_error_naming_it(spec):
    with pytest.raises(UserError, match=f"simulation.device={spec}: no CUDA device"):
        resolve_device(spec, "simulation.device")


def test_the_setting_reaches_every_home_through_the_setup():
    exp = experiment({"simulation": {"device": "cpu", "batch_homes": "on"}, "latency": {"kind": "paper"}})
    assert (exp.setup.device, exp.setup.batch_homes) == ("cpu", "on")
    assert (exp.simulation.device, exp.simulation.batch_homes) == ("cpu", "on")


def test_yaml_and_toml_booleans_read_as_on_and_off():
    paper = {"kind": "paper"}
    assert experiment({"simulation": {"batch_homes": True}, "latency": paper}).setup.batch_homes == "on"
    assert experiment({"simulation": {"batch_homes": False}, "latency": paper}).simulation.batch_homes == "off"


def test_bad_batch_homes_and_batching_on_the_wall_clock_are_errors():
    with pytest.raises(UserError, match="batch_homes must be one of auto, on, off"):
        experiment({"simulation": {"batch_homes": "sometimes"}})
    with pytest.raises(UserError, match="batch_homes=on needs a latency model"):
        experiment({"simulation": {"batch_homes": "on"}, "latency": None})
    assert experiment({"latency": None}).setup.batch_homes == "off"  # auto: homes measure their own time


def test_actors_for_homes_batched_on_the_cpu_one_actor_with_every_cpu():
    layout = SimulationSettings(actors=4, cpus_per_actor=0.5, batch_homes="on").actor_layout(gpus=0)
    assert (layout.actors, layout.cpus_per_actor, layout.gpus_per_actor) == (1, 2.0, 0.0)
    assert layout.backend_config()["init_args"]["num_cpus"] == 2


def test_actors_for_homes_batched_on_gpus_one_actor_per_gpu():
    layout = SimulationSettings(actors=8, cpus_per_actor=2.0).actor_layout(gpus=2)
    assert (layout.actors, layout.cpus_per_actor, layout.gpus_per_actor) == (2, 8.0, 1.0)
    config = layout.backend_config()
    assert config["client_resources"] == {"num_cpus": 8.0, "num_gpus": 1.0}
    assert config["init_args"]["num_gpus"] == 2


def test_actors_for_homes_one_at_a_time_on_a_gpu_share_it():
    layout = SimulationSettings(actors=4, batch_homes="off").actor_layout(gpus=1)
    assert (layout.actors, layout.gpus_per_actor) == (4, 0.25)
    assert layout.backend_config()["init_args"]["num_gpus"] == 1
    given = SimulationSettings(actors=4, gpus_per_actor=0.5, batch_homes="off")
    assert given.actor_layout(gpus=2) == given


def test_actors_on_the_cpu_unbatched_or_on_a_joined_cluster_are_left_as_configured():
    plain = SimulationSettings(actors=3)
    assert plain.actor_layout(gpus=0) == plain  # auto on the CPU: one home at a time
    joined = SimulationSettings(address="10.0.0.1:6379", batch_homes="on")
    assert joined.actor_layout(gpus=4) == joined
