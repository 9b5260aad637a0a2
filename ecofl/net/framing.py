"""Reading a stream whole: the one routine every channel of the network layer reads its frames with.

A frame's length prefix, its header and its payload arrive on a stream in
whatever pieces the kernel (or a sealed channel) hands out; :func:`recv_exactly`
waits for exactly the bytes asked for, or ends with
:class:`~ecofl.net.errors.ChannelClosed` if the stream ends or is reset first.
The control messages (:mod:`.wire`), the sealed records (:mod:`.sealed`) and
a link's tensors (:mod:`.links`) are all read through it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, overload

from ecofl.net.errors import ChannelClosed

Buffer = TypeVar("Buffer")

#: The most bytes one array or tensor a peer announces may have: more is a malformed message, refused before
#: anything is allocated (a home's largest tensor, a layer's weights or a batch's activations, is far smaller).
MAX_ARRAY_BYTES = 4 << 30


def announced_bytes(shape: Sequence[int], itemsize: int) -> int:
    """The bytes of an array of ``shape`` whose elements take ``itemsize`` bytes, as a peer announced it
    (Python integers: no overflow); ValueError for a negative dimension or more than :data:`MAX_ARRAY_BYTES`."""
    if any(d < 0 for d in shape):
        raise ValueError(f"an array of shape {tuple(shape)} announced")
    nbytes = math.prod(shape) * itemsize
    if nbytes > MAX_ARRAY_BYTES:
        raise ValueError(f"an array of {nbytes} bytes announced, more than the {MAX_ARRAY_BYTES} a message carries")
    return nbytes


class Receiver(Protocol):
    """What :func:`recv_exactly` reads from: a socket, or a :class:`~ecofl.net.sealed.SealedSocket`."""

    def recv_into(self, buffer: memoryview, nbytes: int = 0, /) -> int: ...


@overload
def recv_exactly(sock: Receiver, count: int) -> bytearray: ...
@overload
def recv_exactly(sock: Receiver, count: int, into: Buffer) -> Buffer: ...
@overload
def recv_exactly(sock: Receiver, count: int, *, allow_eof: bool) -> bytearray | None: ...


def recv_exactly(sock: Receiver, count: int, into: Any = None, *, allow_eof: bool = False) -> Any:
    """Exactly ``count`` bytes from ``sock``: a new bytearray, or ``into`` once its memory holds them.

    Raises :class:`ChannelClosed` if the stream ends or the connection is
    reset before they all arrived. With ``allow_eof``, a clean end of stream
    before the first byte returns None instead (a stream may end between
    frames, never inside one).
    """
    target = bytearray(count) if into is None else into
    view = memoryview(target).cast("B")
    received = 0
    while received < count:
        try:
            n = sock.recv_into(view[received:], count - received)
        except (ConnectionResetError, BrokenPipeError) as error:
            raise ChannelClosed(str(error)) from error
        if n == 0:
            if received == 0 and allow_eof:
                return None
            raise ChannelClosed("connection closed by peer")
        received += n
    return target
