"""Framed messages on the control channel: a JSON header, then raw array bytes.

Nothing on this channel is ever unpickled. A message is an 8-byte big-endian
length, a UTF-8 JSON object, and the bytes of the arrays the header lists
under ``"arrays"`` (name, dtype, shape), back to back. Before a peer has
authenticated (:mod:`.auth`) its messages are read by :mod:`.preauth`
instead (a deadline, a small header, bounded nesting, no arrays); after,
the messages travel on the connection's
:class:`~ecofl.net.sealed.SealedSocket` and are read here.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

import numpy as np

from ecofl.net.framing import announced_bytes, recv_exactly
from ecofl.net.sealed import SealedSocket

HEADER_LIMIT = 64 << 20

LENGTH = struct.Struct(">Q")  # a message's header length
Channel = socket.socket | SealedSocket

__all__ = ["Channel", "LENGTH", "send_message", "recv_message"]


def send_message(sock: Channel, header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> None:
    """Send ``header`` (JSON-serialisable) and ``arrays`` (numeric, any shape) as one message."""
    arrays = arrays or {}
    contiguous = {name: np.asarray(a, order="C") for name, a in arrays.items()}  # keeps 0-d arrays 0-d
    if any(a.dtype.hasobject for a in contiguous.values()):
        raise TypeError("object arrays cannot travel on the control channel")
    listing = [{"name": n, "dtype": a.dtype.str, "shape": list(a.shape)} for n, a in contiguous.items()]
    body = json.dumps({**header, "arrays": listing}).encode()
    sock.sendall(LENGTH.pack(len(body)) + body)
    for array in contiguous.values():
        if array.size:
            sock.sendall(memoryview(array.reshape(-1)).cast("B"))


def recv_message(sock: Channel) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Receive one message from an authenticated peer; :class:`~ecofl.net.errors.ChannelClosed` at end of
    stream, ValueError if malformed."""
    (length,) = LENGTH.unpack(recv_exactly(sock, LENGTH.size))
    if length > HEADER_LIMIT:
        raise ValueError(f"control message header of {length} bytes exceeds {HEADER_LIMIT}")
    header = json.loads(recv_exactly(sock, length))
    if not isinstance(header, dict):
        raise ValueError("control message header is not a JSON object")
    listing = header.pop("arrays", [])
    arrays: dict[str, np.ndarray] = {}
    for entry in listing:
        try:
            dtype, shape = np.dtype(entry["dtype"]), tuple(int(d) for d in entry["shape"])
        except (KeyError, TypeError) as error:
            raise ValueError(f"a malformed array listing: {error!r}") from None
        if dtype.hasobject:
            raise ValueError("object arrays are refused")
        data = recv_exactly(sock, announced_bytes(shape, dtype.itemsize))
        arrays[entry["name"]] = np.frombuffer(data, dtype=dtype).reshape(shape)
    return header, arrays
