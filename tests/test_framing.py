"""The one framing routine: exactly the bytes asked for, however the stream cuts them; ChannelClosed otherwise."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from ecofl.net.errors import ChannelClosed
from ecofl.net.framing import recv_exactly


def test_bytes_sent_in_pieces_arrive_whole_into_a_new_buffer_or_a_given_one():
    reader, writer = socket.socketpair()
    with reader, writer:
        def send() -> None:
            for piece in (b"ab", b"c", b"defg", bytes(range(8))):
                writer.sendall(piece)

        thread = threading.Thread(target=send)
        thread.start()
        assert recv_exactly(reader, 7) == bytearray(b"abcdefg")
        into = np.zeros(2, dtype=np.int32)
        assert recv_exactly(reader, into.nbytes, into) is into
        thread.join(timeout=5)
        assert into.tobytes() == bytes(range(8))
        assert recv_exactly(reader, 0) == bytearray()


def test_a_stream_that_ends_is_channel_closed_except_cleanly_between_frames():
    reader, writer = socket.socketpair()
    with reader:
        writer.sendall(b"xy")
        writer.close()
        with pytest.raises(ChannelClosed, match="closed by peer"):
            recv_exactly(reader, 3, allow_eof=True)  # ended inside a frame
        assert recv_exactly(reader, 4, allow_eof=True) is None  # ended between frames
        with pytest.raises(ChannelClosed, match="closed by peer"):
            recv_exactly(reader, 4)


def test_a_reset_connection_is_channel_closed():
    class Reset:
        def recv_into(self, buffer: memoryview, nbytes: int = 0, /) -> int:
            raise ConnectionResetError("connection reset by peer")

    with pytest.raises(ChannelClosed, match="reset"):
        recv_exactly(Reset(), 1)
