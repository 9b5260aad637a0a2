"""The datasets of the Eco-FL experiments, decoded once per machine.

Eco-FL (§6.1) trains the FedAvg models on MNIST, Fashion-MNIST and CIFAR-10;
scikit-learn's 8x8 ``digits`` is the always-offline stand-in for quick runs
and tests. :func:`load_dataset` returns the whole train and test split as
normalised float32 tensors; the result is cached in-process, so hundreds of
simulated homes index into one shared copy (treat the tensors as read-only).

**One decoded copy per machine.** The normalised images are also written
once to ``$ECOFL_CACHE_DIR`` (default ``~/.cache/ecofl``) as ``.npy`` files
named by a hash of the raw pixels, and every process maps them
(``numpy.load(mmap_mode="c")``: copy-on-write, so the pages stay shared
unless a process writes to them). The Ray actors of a simulation then share
one copy of Fashion-MNIST's 220 MB instead of decoding one each
(``docs/scale.md`` has the measured memory). An unwritable cache directory
only costs that sharing.

Where the files come from:

* ``digits``: scikit-learn's bundled copy; a seeded stratified 1437/360 split.
* ``fashion_mnist``: ``root`` in torchvision layout (``ROOT/FashionMNIST/raw``)
  if given, else Debian's ``dataset-fashion-mnist`` files in
  ``/usr/share/datasets/fashion-mnist``, else a torchvision download if allowed.
* ``mnist``, ``cifar10``: torchvision layout under ``root`` (default
  ``~/.cache/ecofl/data``), downloaded there only if allowed.

Normalisation uses the per-channel mean and standard deviation of the
training split (for MNIST this is the familiar 0.1307/0.3081).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ecofl.accelerator import host_array
from ecofl.data.idx import find_idx_files, read_idx
from ecofl import names
from ecofl.errors import UserError

log = logging.getLogger(__name__)

DATASETS = names.DATASETS
#: Where decoded datasets are shared between processes: ``$ECOFL_CACHE_DIR``, else this.
DEFAULT_CACHE_DIR = Path("~/.cache/ecofl")
#: Bump when the decoding changes, so old decoded files are not reused.
DECODED_FORMAT = 1

DEFAULT_ROOT = Path("~/.cache/ecofl/data")
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")

DIGITS_TEST_SIZE = 360
DIGITS_SPLIT_SEED = 0


@dataclass(frozen=True)
class Split:
    """One split: ``x`` float32 [N, C, H, W] normalised, ``y`` int64 [N] class ids."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True)
class Dataset:
    """A dataset with both splits in memory and where its files came from."""

    name: str
    train: Split
    test: Split
    num_classes: int
    input_shape: tuple[int, int, int]
    class_names: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class _Raw:
    """Undecoded pixels: uint8 [N, C, H, W] arrays in 0..max_value, labels, origin."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    max_value: float
    source: str


_DIGIT_NAMES = tuple(str(d) for d in range(10))
_FASHION_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                  "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
_CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer",
                  "dog", "frog", "horse", "ship", "truck")


def load_dataset(
    name: str, root: str | None = None, download: bool = False, options: DataOptions | None = None
) -> Dataset:
    """Load dataset ``name`` (one of :data:`DATASETS`), decoded once per process and root.

    Raises :class:`UserError` for an unknown name, or when the files are not
    found and cannot be downloaded; the message says how to get them, naming
    the root and download options as the caller's user spells them
    (``options``; default the command line's ``--data-root`` and ``--download``).
    """
    if name not in DATASETS:
        raise UserError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    resolved = str(Path(root).expanduser().resolve()) if root is not None else None
    try:
        try:
            return _load(name, resolved, False)  # files already there: one cache entry either way
        except DataFilesMissing:
            if not download:
                raise
        return _load(name, resolved, True)
    except DataFilesMissing as missing:
        raise UserError(missing.advice(options or DataOptions())) from None


@lru_cache(maxsize=None)
def _load(name: str, root: str | None, download: bool) -> Dataset:
    loader, class_names = _LOADERS[name]
    raw = loader(Path(root) if root is not None else None, download)
    train_x, test_x = _decoded(name, raw)
    return Dataset(
        name=name,
        train=Split(train_x, torch.from_numpy(raw.train_y.astype(np.int64))),
        test=Split(test_x, torch.from_numpy(raw.test_y.astype(np.int64))),
        num_classes=len(class_names),
        input_shape=tuple(train_x.shape[1:]),
        class_names=class_names,
        source=raw.source,
    )


def _decoded(name: str, raw: _Raw) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalised train and test images: mapped from this machine's cache, written there first if new."""
    digest = hashlib.blake2b(digest_size=12)
    for part in (str(DECODED_FORMAT), str(raw.max_value), raw.train_x.tobytes(), raw.test_x.tobytes()):
        digest.update(part.encode() if isinstance(part, str) else part)
    directory = Path(os.environ.get("ECOFL_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser() / "decoded"
    paths = [directory / f"{name}-{digest.hexdigest()}-{split}.npy" for split in ("train", "test")]
    if not all(path.is_file() for path in paths):
        train_x, mean, std = _normalise(raw.train_x, raw.max_value)
        test_x, _, _ = _normalise(raw.test_x, raw.max_value, mean, std)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for path, array in zip(paths, (train_x, test_x)):
                _save_atomically(path, host_array(array))
        except OSError as error:
            log.warning("cannot share the decoded %s in %s (%s): this process keeps its own copy", name, directory,
                        error)
            return train_x, test_x
    return tuple(torch.from_numpy(np.load(path, mmap_mode="c")) for path in paths)


def _save_atomically(path: Path, array: np.ndarray) -> None:
    """Write ``array`` to ``path`` so that no process ever maps a partly written file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            np.save(file, array)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _normalise(
    pixels: np.ndarray,
    max_value: float,
    mean: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scale to [0, 1], then standardise per channel (statistics of the train split)."""
    x = torch.from_numpy(np.ascontiguousarray(pixels)).to(torch.float32).div_(max_value)
    if mean is None or std is None:
        mean = x.mean(dim=(0, 2, 3), keepdim=True)
        std = x.std(dim=(0, 2, 3), keepdim=True)
    return x.sub_(mean).div_(std), mean, std


def _load_digits(root: Path | None, download: bool) -> _Raw:
    """scikit-learn's 1797 8x8 digits, split 1437/360 stratified by class (seed 0)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = bunch.images.astype(np.uint8)[:, None, :, :]  # values 0..16
    train_x, test_x, train_y, test_y = train_test_split(
        images, bunch.target, test_size=DIGITS_TEST_SIZE,
        random_state=DIGITS_SPLIT_SEED, stratify=bunch.target,
    )
    return _Raw(train_x, train_y, test_x, test_y, 16.0, "sklearn:load_digits")


def _load_fashion_mnist(root: Path | None, download: bool) -> _Raw:
    """Fashion-MNIST from ``root``, then Debian's package, then a download if allowed."""
    searched: list[Path] = []
    if root is not None:
        searched.append(root / "FashionMNIST" / "raw")
        found = _read_idx_dir(searched[-1], "root")
        if found is not None:
            return found
    searched.append(DEBIAN_FASHION_MNIST)
    found = _read_idx_dir(DEBIAN_FASHION_MNIST, "debian")
    if found is not None:
        return found
    if not download:
        raise _missing("fashion_mnist", searched, "FashionMNIST/raw")
    target = root if root is not None else DEFAULT_ROOT.expanduser()
    return _download_idx("fashion_mnist", "FashionMNIST", target)


def _load_mnist(root: Path | None, download: bool) -> _Raw:
    """MNIST in torchvision layout under ``root``, downloaded there if allowed."""
    target = root if root is not None else DEFAULT_ROOT.expanduser()
    found = _read_idx_dir(target / "MNIST" / "raw", "root")
    if found is not None:
        return found
    if not download:
        raise _missing("mnist", [target / "MNIST" / "raw"], "MNIST/raw")
    return _download_idx("mnist", "MNIST", target)


def _load_cifar10(root: Path | None, download: bool) -> _Raw:
    """CIFAR-10 (python pickles) under ``root``, read and checked by torchvision."""
    from torchvision.datasets import CIFAR10

    target = root if root is not None else DEFAULT_ROOT.expanduser()
    directory = target / CIFAR10.base_folder
    origin = "root"
    if not (directory / "test_batch").is_file():
        if not download:
            raise _missing("cifar10", [directory], CIFAR10.base_folder)
        _download("cifar10", partial(CIFAR10, str(target), train=True, download=True), CIFAR10.base_folder)
        origin = "download"
    try:
        train = CIFAR10(str(target), train=True, download=False)
        test = CIFAR10(str(target), train=False, download=False)
    except RuntimeError as error:  # torchvision: "Dataset not found or corrupted"
        raise DataFilesMissing("cifar10", f"the files under {directory} are unusable ({error}); delete them",
                               CIFAR10.base_folder) from error
    return _Raw(
        train.data.transpose(0, 3, 1, 2), np.asarray(train.targets),
        test.data.transpose(0, 3, 1, 2), np.asarray(test.targets),
        255.0, f"{origin}:{directory}",
    )


def _read_idx_dir(directory: Path, origin: str) -> _Raw | None:
    """The MNIST-style dataset in ``directory``, or None if its four files are not all there."""
    files = find_idx_files(directory)
    if files is None:
        return None
    arrays = {key: read_idx(path) for key, path in files.items()}
    return _Raw(
        arrays["train", "images"][:, None], arrays["train", "labels"],
        arrays["test", "images"][:, None], arrays["test", "labels"],
        255.0, f"{origin}:{directory}",
    )


def _download_idx(name: str, folder: str, target: Path) -> _Raw:
    """Fetch an MNIST-style dataset with torchvision into ``target/folder/raw``.

    ``folder`` is the torchvision class name, which is also its directory name.
    """
    import torchvision.datasets

    dataset_class = getattr(torchvision.datasets, folder)
    _download(name, partial(dataset_class, str(target), train=True, download=True), f"{folder}/raw")
    found = _read_idx_dir(target / folder / "raw", "download")
    if found is None:
        raise UserError(f"{name}: download finished but {target / folder / 'raw'} lacks the IDX files")
    return found


def _download(name: str, fetch: Callable[[], object], layout: str) -> None:
    """Run a torchvision download, turning network failures into a one-line :class:`DataFilesMissing`."""
    try:
        fetch()
    except (OSError, RuntimeError) as error:  # URLError is an OSError
        reason = " ".join(str(error).split())
        raise DataFilesMissing(name, f"download failed ({reason})", layout) from error


def _missing(name: str, searched: list[Path], layout: str) -> DataFilesMissing:
    places = ", ".join(str(p) for p in searched)
    return DataFilesMissing(name, f"data files not found (looked in {places})", layout)


@dataclass(frozen=True)
class DataOptions:
    """How the user of an entry point names a dataset's root and the permission to download (its advice)."""

    root: str = "--data-root ROOT"
    download: str = "--download"


#: ``simulations.run`` and the ``flwr run`` config: the ``dataset`` section's keys.
CONFIG_OPTIONS = DataOptions("dataset.root=ROOT", "dataset.download=true")


class DataFilesMissing(UserError):
    """A dataset's files are not here and could not be fetched; :meth:`advice` says how to get them."""

    def __init__(self, name: str, problem: str, layout: str | None) -> None:
        self.name, self.problem, self.layout = name, problem, layout
        super().__init__(self.advice(DataOptions()))

    def advice(self, options: DataOptions) -> str:
        """The problem and the ways to get the files, naming the options as ``options`` spells them."""
        ways = []
        if self.name == "fashion_mnist":
            ways.append("install Debian's package (apt-get install dataset-fashion-mnist)")
        ways.append(f"pass {options.download} where the internet is reachable")
        if self.layout is not None:
            ways.append(f"or put the torchvision files under ROOT/{self.layout} and pass {options.root}")
        return f"{self.name}: {self.problem}; to get them: " + "; ".join(ways)


_LOADERS: dict[str, tuple[Callable[[Path | None, bool], _Raw], tuple[str, ...]]] = {
    "digits": (_load_digits, _DIGIT_NAMES),
    "fashion_mnist": (_load_fashion_mnist, _FASHION_NAMES),
    "mnist": (_load_mnist, _DIGIT_NAMES),
    "cifar10": (_load_cifar10, _CIFAR10_NAMES),
}
