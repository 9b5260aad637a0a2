"""The federation as the client side holds it: the dataset split over the homes, the model, the latency.

Every home of a simulated federation is described by one
:class:`~ecofl.fl.federation_setup.FederationSetup` (the dataset, how it is
split over the homes, the model and the latency model). The server sends the
setup with every message, so a Ray actor that serves many homes needs no
configuration of its own: :func:`federation` decodes the dataset and
partitions it once per process and setup, and each home then indexes its own
part (a copy of a few hundred samples, made per
message rather than cached, so an actor's memory does not grow with the
homes it serves) (Flower's examples call this module
``task.py``).

A home's response latency comes from the latency model of ``ecofl.fl.latency``
evaluated at the virtual time the server sends; with ``latency = {}`` the home
reports the wall-clock time its training took instead (a real deployment).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import torch

from ecofl.accelerator import device_label, host_array, resolve_device
from ecofl.batched_training import batching_obstacle
from ecofl.data import CONFIG_OPTIONS, load_dataset
from ecofl.data.partition import partition
from ecofl.data.stats import label_histograms
from ecofl.errors import UserError
from ecofl.fl.federation_setup import FederationSetup
from ecofl.fl.grouping import kmeans_centres
from ecofl.fl.latency import make_latency_model
from ecofl.models import build_model

RLG_SCHEMES = ("rlg-iid", "rlg-niid")


@dataclass(frozen=True)
class HomeData:
    """One home's private data and its label histogram (pi_n in Eco-FL §5.2)."""

    home: int
    x: torch.Tensor
    y: torch.Tensor
    label_histogram: np.ndarray


class Federation:
    """The dataset split over all homes of a :class:`FederationSetup`, built once per process."""

    def __init__(self, setup: FederationSetup) -> None:
        self.setup = setup
        self.dataset = load_dataset(**setup.dataset, options=CONFIG_OPTIONS)
        self.latency_model = make_latency_model(setup.latency) if setup.latency else None
        labels = host_array(self.dataset.train.y)
        options = dict(setup.partition)
        scheme = options.pop("scheme")
        if scheme in RLG_SCHEMES and "client_groups" not in options:
            options["client_groups"] = self._latency_groups(int(options.get("num_groups", 5)))
        self.parts = partition(labels, scheme, setup.num_homes, seed=setup.seed, **options)
        self.histograms = label_histograms(labels, self.parts, self.dataset.num_classes)

    def _latency_groups(self, num_groups: int) -> np.ndarray | None:
        """Response-latency groups for RLG partitions: K-means on the homes' latency at t = 0.

        Eco-FL §6.1 clusters the clients' delays into 5 RLGs with K-means and
        then assigns labels per RLG; groups are numbered by their centre
        (group 0 fastest). Without a latency model the partitioner's default
        contiguous groups are used.
        """
        if self.latency_model is None:
            return None
        latencies = [self.latency_model.latency(h, 0.0) for h in range(self.setup.num_homes)]
        groups, _ = kmeans_centres(latencies, num_groups, self.setup.seed)
        return groups

    def home(self, home: int) -> HomeData:
        if not 0 <= home < self.setup.num_homes:
            raise UserError(f"home {home} is not one of the {self.setup.num_homes} homes")
        index = torch.from_numpy(self.parts[home])
        return HomeData(home, self.dataset.train.x[index], self.dataset.train.y[index], self.histograms[home])

    def new_model(self) -> torch.nn.Module:
        """A fresh model of the setup, on the CPU."""
        options = self.setup.model.get("options") or {}
        return build_model(self.setup.model["name"], self.dataset.input_shape, self.dataset.num_classes, **options)

    @cached_property
    def device(self) -> torch.device:
        """Where this process's homes train: the setup's ``device`` resolved here (a UserError when absent)."""
        return resolve_device(self.setup.device, "simulation.device")

    @cached_property
    def device_label(self) -> str:
        return device_label(self.device)

    @cached_property
    def batches_homes(self) -> bool:
        """Whether this process trains a dispatch's homes together: ``batch_homes`` is on, or auto on an
        accelerator, and the model can be batched exactly (:func:`ecofl.batched_training.batching_obstacle`)."""
        mode = self.setup.batch_homes
        wanted = mode == "on" or (mode == "auto" and self.device.type != "cpu")
        return wanted and batching_obstacle(self.new_model()) is None

    def latency(self, home: int, virtual_time: float) -> float | None:
        """The home's response latency at ``virtual_time``, or None when it is measured."""
        if self.latency_model is None:
            return None
        return float(self.latency_model.latency(home, virtual_time))


@lru_cache(maxsize=4)
def federation(setup_json: str) -> Federation:
    """The :class:`Federation` of a setup (JSON), cached per process."""
    torch.set_num_threads(1)  # several homes train side by side on few cores
    return Federation(FederationSetup.from_json(setup_json))

