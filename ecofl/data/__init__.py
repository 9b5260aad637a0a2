"""Datasets and their partitions over homes (Eco-FL §6.1).

:func:`load_dataset` gives a whole dataset as normalised tensors, decoded
once per process; :func:`partition` splits its training labels over clients
(IID, k-class shards, Dirichlet, RLG-IID, RLG-NIID); :func:`label_histograms`
counts each client's labels.
"""

from ecofl.data.datasets import CONFIG_OPTIONS, DATASETS, DataOptions, Dataset, Split, load_dataset
from ecofl.data.partition import PARTITION_SCHEMES, default_client_groups, partition
from ecofl.data.stats import js_to_uniform, label_histograms, partition_summary

__all__ = [
    "CONFIG_OPTIONS",
    "DATASETS",
    "DataOptions",
    "PARTITION_SCHEMES",
    "Dataset",
    "Split",
    "default_client_groups",
    "js_to_uniform",
    "label_histograms",
    "load_dataset",
    "partition",
    "partition_summary",
]
