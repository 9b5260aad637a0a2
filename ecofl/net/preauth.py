"""What a peer says before it has proved the home's secret: read by a deadline, parsed within bounds.

Anyone who reaches a port of a home may send anything: a length prefix of
2**64, a header of 2,000 nested brackets (Python's JSON parser recurses:
``RecursionError``), a number like ``1e400`` (a float that overflows to
infinity, then ``OverflowError`` wherever it meets ``int``), a string where
a number belongs, or one byte every half second. So everything a handshake
reads from a peer it does not trust yet goes through this module:

- the whole message must arrive by the handshake's deadline, a point in time
  rather than a time limit per read (a peer trickling a byte at a time runs
  out of time too): :class:`TimeoutError` once it has passed,
  :class:`~ecofl.net.errors.ChannelClosed` if the stream ends first;
- its header is at most :data:`PREAUTH_LIMIT` bytes of UTF-8 JSON, nested at
  most :data:`MAX_DEPTH` deep, with finite numbers only, and no arrays;
- it is then one of the typed messages the reader expects
  (:class:`~ecofl.net.schema.MessageSet`: types, ranges and patterns of every
  field).

The parser (:func:`parse_bounded`, and the decoding after it) raises nothing
but :class:`~ecofl.net.schema.MalformedMessage`, whatever the bytes.
"""

from __future__ import annotations

import json
import math
import socket
import time
from typing import Any

from ecofl.net.framing import recv_exactly
from ecofl.net.schema import MalformedMessage, MessageSet, encode
from ecofl.net.wire import LENGTH, send_message

PREAUTH_LIMIT = 4096  # bytes of header accepted from a peer that has not proved the secret
MAX_DEPTH = 4  # objects and lists nested in one such header (a handshake message needs 1)


def parse_bounded(body: bytes | bytearray, limit: int = PREAUTH_LIMIT, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in ``body``; :class:`MalformedMessage` if it is larger, deeper or other than plain finite JSON.

    The nesting is measured before the parser runs, so no input makes it
    recurse deeper than ``max_depth``.
    """
    if len(body) > limit:
        raise MalformedMessage(f"a header of {len(body)} bytes exceeds {limit}")
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMessage("a header that is not UTF-8") from None
    if _depth(text) > max_depth:
        raise MalformedMessage(f"a header nested deeper than {max_depth}")
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except ValueError as error:  # json's own errors, and ours from the hooks
        raise MalformedMessage(f"a header that is not plain JSON: {error}") from None


def read_preauth(sock: socket.socket, messages: MessageSet, deadline: float) -> Any:
    """One message of ``messages`` from an unauthenticated peer, whole by ``deadline`` (``time.monotonic()``).

    :class:`MalformedMessage` if it is not one of them, well formed;
    :class:`TimeoutError` once the deadline passed; ChannelClosed (or another
    OSError) if the connection ends or breaks first.
    """
    receiver = _Until(sock, deadline)
    (length,) = LENGTH.unpack(recv_exactly(receiver, LENGTH.size))
    if length > PREAUTH_LIMIT:
        raise MalformedMessage(f"a header of {length} bytes announced, more than {PREAUTH_LIMIT}")
    header = parse_bounded(recv_exactly(receiver, length))
    if isinstance(header, dict) and header.pop("arrays", []) != []:  # the wire's framing lists none here
        raise MalformedMessage("arrays sent before the handshake")
    return messages.decode(header)


def send_preauth(sock: socket.socket, msg: Any, deadline: float) -> None:
    """Send the typed message ``msg`` on a handshake, by ``deadline`` (TimeoutError after)."""
    sock.settimeout(_remaining(deadline))
    send_message(sock, encode(msg))


class _Until:
    """A socket whose every read must end by one deadline: the time limit of a whole message, not of each read."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline

    def recv_into(self, buffer: memoryview, nbytes: int = 0, /) -> int:
        self.sock.settimeout(_remaining(self.deadline))
        return self.sock.recv_into(buffer, nbytes)


def _remaining(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("the handshake's deadline passed")
    return remaining


def _depth(text: str) -> int:
    """How deep the objects and lists of JSON ``text`` nest (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")
