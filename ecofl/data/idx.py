"""Reading MNIST-style IDX files (``*-idx3-ubyte`` images, ``*-idx1-ubyte`` labels).

MNIST and Fashion-MNIST ship as four IDX files, gzipped or not: Debian's
``dataset-fashion-mnist`` package keeps the ``.gz`` files in one directory,
torchvision keeps both forms under ``ROOT/<Class>/raw``. This module finds
the four files in a directory and decodes them with numpy, so no copy or
unpacking step is needed.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

# file stem per (split, kind), as published with MNIST and Fashion-MNIST
IDX_STEMS = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}

# IDX type codes (byte 3 of the magic number); MNIST-style files use 0x08
_UNSIGNED_BYTE = 0x08


def find_idx_files(directory: Path) -> dict[tuple[str, str], Path] | None:
    """The four IDX files in ``directory`` (plain or ``.gz``), or None if any is missing."""
    found: dict[tuple[str, str], Path] = {}
    for key, stem in IDX_STEMS.items():
        for candidate in (directory / stem, directory / f"{stem}.gz"):
            if candidate.is_file():
                found[key] = candidate
                break
        else:
            return None
    return found


def read_idx(path: Path) -> np.ndarray:
    """Decode one unsigned-byte IDX file into a uint8 array of its declared shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = bytearray(handle.read())  # writable, so torch can share it
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != _UNSIGNED_BYTE:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    ndim = data[3]
    header_end = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    array = np.frombuffer(data, dtype=np.uint8, offset=header_end)
    if array.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated: header says {shape}, found {array.size} bytes")
    return array.reshape(shape)
