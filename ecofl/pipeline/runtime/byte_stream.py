"""Stage state over a tensor link as one stream of bytes: how replicas and layer migrations travel.

A MobileNetV2 stage's state is some hundred tensors, most of them a batch
norm's few hundred bytes. Sent as a message each, every one is sealed, sent,
received and opened, and wakes every thread waiting on the link: CPU the
bytes do not explain, which a confined device pays out of the quota it
computes with (0.1-0.2 CPU-s a sync-round at every stage for replicas, one
run each). Here the tensors' bytes, in the order both ends list them, are
cut into pieces of what the link carries in ``PIECE_S``
(:func:`piece_bytes`: few messages, and an activation waits behind one
piece at most), and the receiver copies each
piece into its buffers wherever it falls
(:class:`ByteSink`). Both ends agree on the tensors and their order (the
plan says which layers, :func:`stream_keys` their order); the receiver checks every
piece against the bytes it still expects.

Where the receiver's buffers lie end to end in one block of memory, in the
stream's order (:func:`stream_buffers`), its link opens each piece straight
into the block (:func:`opened_in_place`, :meth:`ecofl.net.links.PeerLink.receive_into`):
the bytes are decrypted where they stay, with no piece allocated and no copy
after (host CPU a byte, both ends: :mod:`benchmarks.copy_path`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import torch

from ecofl.net.links import POLL_S, AbortCheck, Ticket, never_aborted
from ecofl.net.mesh import EpochMesh
from ecofl.net.pacing import TokenBucket

#: A piece is what its paced link carries in this long. While it is paced a piece steps aside for every activation
#: (:class:`ecofl.net.links.PeerLink`); once paced it goes out whole, and each piece costs its ends a wake-up out of
#: the pause before it besides its bytes: at 100 Mbps, 50 ms pieces cost 2.07 ns of host CPU a byte for both ends,
#: 200 ms pieces 1.33 (a replica over TCP on loopback in one process, 2026-12-03 03:50; ``benchmarks/copy_path.py``).
#: Inside confined runs the reader's cost moved less (docs/pipeline.md, "A replica opened where it stays").
PIECE_S = 0.2
MIN_PIECE_BYTES, MAX_PIECE_BYTES = 64 << 10, 4 << 20  # 4 MiB: an unpaced link's (a real network's) pieces


def stream_keys(state: Mapping[str, torch.Tensor]) -> list[str]:
    """A stage state's keys in the order both ends of a stream list its tensors: by element size, largest first,
    then by key. Laid end to end in this order every tensor starts at a multiple of its element size (an int64
    count never follows a float32 batch norm of an odd length), so any state can be (:func:`stream_buffers`)."""
    return sorted(state, key=lambda key: (-state[key].element_size(), key))


def in_stream_order(state: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """A stage state's tensors in the order both ends of a stream list them (:func:`stream_keys`)."""
    return [state[key] for key in stream_keys(state)]


def piece_bytes(bucket: TokenBucket | None, piece_s: float = PIECE_S) -> int:
    """The bytes of one piece on a link paced by ``bucket`` (None: not paced here): what it carries in ``piece_s``."""
    if bucket is None:
        return MAX_PIECE_BYTES
    return int(min(MAX_PIECE_BYTES, max(MIN_PIECE_BYTES, bucket.rate * piece_s)))


def stream_buffers(likes: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Empty tensors shaped like ``likes`` (by key), laid end to end in one new block in the order a stream
    carries them (:func:`in_stream_order`); each in memory of its own on its device where they are not all on
    the host."""
    if any(like.device.type != "cpu" for like in likes.values()):
        return {key: torch.empty_like(like.detach()) for key, like in likes.items()}
    keys = stream_keys(likes)
    starts, end = [], 0
    for key in keys:
        starts.append(end)
        end += likes[key].numel() * likes[key].element_size()
    block = torch.empty(end, dtype=torch.uint8)
    return {key: block[start:start + likes[key].numel() * likes[key].element_size()].view(likes[key].dtype)
            .view(likes[key].shape) for key, start in zip(keys, starts)}


def end_to_end(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The one flat ``uint8`` block ``tensors`` fill end to end, in order (None: they do not, or have no bytes)."""
    tensors = [t for t in tensors if t.numel()]
    if not tensors or not all(t.is_contiguous() and t.device.type == "cpu" for t in tensors):
        return None
    first = tensors[0]
    address = first.data_ptr()
    for t in tensors:
        if t.data_ptr() != address:
            return None
        address += t.numel() * t.element_size()
    storage, offset = first.untyped_storage(), first.storage_offset() * first.element_size()
    if offset + address - first.data_ptr() > storage.nbytes():  # neighbours in memory, not one block
        return None
    return torch.empty(0, dtype=torch.uint8).set_(storage, offset, (address - first.data_ptr(),))


@contextlib.contextmanager
def opened_in_place(mesh: EpochMesh, receives: Sequence[tuple[int, Sequence[torch.Tensor]]], tag: int
                    ) -> Iterator[None]:
    """While inside, the links open the pieces each rank sends under ``tag`` straight into its buffers
    (``receives``: rank, buffers in stream order, a rank's streams in the order it sends them), where these lie
    end to end and the link takes them before any piece under ``tag`` came; the rest are copied in."""
    blocks: dict[int, list[torch.Tensor]] = {}
    for rank, buffers in receives:
        if (block := end_to_end(buffers)) is not None and blocks.get(rank) != []:
            blocks.setdefault(rank, []).append(block)
        else:  # a stream that is copied in: none after it from that rank can be opened in place
            blocks[rank] = []
    announced = {rank: mine for rank, mine in blocks.items() if mine and mesh.receive_into(rank, tag, mine)}
    try:
        yield
    finally:
        for rank, mine in announced.items():
            for block in mine:
                mesh.forget(rank, tag, block)


def byte_views(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor as a flat view of its bytes (writing one writes the tensor)."""
    return [t.detach().view(-1).view(torch.uint8) for t in tensors]


def byte_pieces(tensors: Sequence[torch.Tensor], size_bytes: int) -> list[torch.Tensor]:
    """Every byte of ``tensors`` in order, as flat ``uint8`` pieces of ``size_bytes`` (the last one shorter; one
    empty piece where there are no bytes). A piece within one tensor, or of tensors that lie end to end (a
    committed copy, :meth:`~.stage_state.StageState.capture`), is a view of them; one across other tensors (a
    batch norm's few bytes beside its neighbours) copies their parts."""
    if (block := end_to_end(tensors)) is not None:
        return [block[start:start + size_bytes] for start in range(0, block.numel(), size_bytes)]
    result: list[torch.Tensor] = []
    parts: list[torch.Tensor] = []
    room = size_bytes
    for tensor in tensors:
        view, at = tensor.detach().reshape(-1).view(torch.uint8), 0
        while at < view.numel():
            n = min(room, view.numel() - at)
            parts.append(view[at:at + n])
            at, room = at + n, room - n
            if room == 0:
                result.append(parts[0] if len(parts) == 1 else torch.cat(parts))
                parts, room = [], size_bytes
    if parts or not result:
        result.append(torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8))
    return result


class ByteSink:
    """Tensors' bytes filled in order from pieces of any size (a piece may span several tensors): as one flat
    view where they lie end to end, else as each one's."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        block = end_to_end(tensors)
        self.views = [block] if block is not None else [view for view in byte_views(tensors) if view.numel()]
        self.total = sum(view.numel() for view in self.views)
        self.filled = 0
        self._view = self._offset = 0  # where the next byte goes

    def write(self, piece: torch.Tensor) -> None:
        """Copy ``piece`` (flat ``uint8``, at most the bytes left) into the views, where the last one ended (no
        copy for a piece opened there already, :func:`opened_in_place`)."""
        at = 0
        in_place = piece.numel() > 0 and piece.data_ptr() == self.views[self._view].data_ptr() + self._offset
        with torch.no_grad():
            while at < piece.numel():
                view = self.views[self._view]
                n = min(view.numel() - self._offset, piece.numel() - at)
                if not in_place:
                    view[self._offset:self._offset + n].copy_(piece[at:at + n])
                at, self._offset = at + n, self._offset + n
                if self._offset == view.numel():
                    self._view, self._offset = self._view + 1, 0
        self.filled += piece.numel()


def send_stream(mesh: EpochMesh, rank: int, tensors: Sequence[torch.Tensor], tag: int,
                bucket: TokenBucket | None, background: bool = False, piece_s: float = PIECE_S) -> list[Ticket]:
    """Post ``tensors``' bytes to ``rank`` under ``tag`` in pieces sized for ``bucket``'s link; their tickets."""
    pieces = byte_pieces(tensors, piece_bytes(bucket, piece_s))
    return [mesh.send(rank, piece, tag, bucket, background) for piece in pieces]


def receive_stream(mesh: EpochMesh, rank: int, tag: int, buffers: Sequence[torch.Tensor], what: str,
                   abort: AbortCheck = never_aborted, poll_s: float = POLL_S) -> None:
    """Fill ``buffers`` in order from the pieces ``rank`` sends under ``tag`` (no bytes: one empty piece),
    checking ``abort`` every ``poll_s`` while none arrives; a piece that is not bytes or does not fit what is
    left is a ValueError naming ``what`` travels."""
    sink = ByteSink(buffers)
    while True:
        piece = mesh.recv(rank, tag, abort=abort, poll_s=poll_s)
        left = sink.total - sink.filled
        fits = 0 < piece.numel() <= left or left == 0 == piece.numel()
        if piece.dim() != 1 or piece.dtype != torch.uint8 or not fits:
            raise ValueError(f"rank {rank} sent a {piece.dtype} {tuple(piece.shape)} {what} piece: "
                             f"{left} bytes were left to fill")
        sink.write(piece)
        if sink.filled == sink.total:
            return
