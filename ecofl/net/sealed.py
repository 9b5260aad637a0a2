"""A sealed channel: the bytes of an authenticated connection, encrypted and authenticated record by record.

After the mutual challenge-response of :mod:`.auth` both ends hold two
fresh 256-bit keys, one per direction, derived from the home's secret and
both nonces (HKDF-SHA256, RFC 5869). Every :meth:`SealedSocket.sendall`
then travels as one or more *records*::

    length (4 bytes, big-endian)  |  AES-256-GCM(key, nonce = record counter, plaintext, aad = length)

with at most :data:`RECORD_BYTES` of plaintext per record. A record that was
altered, replayed, dropped, reordered or sent by anyone without the key fails
its tag and ends the connection (:class:`ChannelClosed`); a peer that never
proved the secret cannot produce a single valid record. This is the layer TLS
would give with a pre-shared key (RFC 8446 §2.2), which Python's ``ssl``
module cannot do before 3.13; AES-GCM is the ``cryptography`` package's (the
same that Flower uses for its own keys).

:class:`SealedSocket` offers the part of the socket interface the control
protocol (:mod:`.wire`), the heartbeat and the tensor links use (``sendall``,
``recv_into``, ``fileno`` for selectors, timeouts, ``close``), so every
channel inside a home is sealed by the same code.
"""

from __future__ import annotations

import socket
import struct
import threading

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ecofl.net.errors import ChannelClosed
from ecofl.net.framing import recv_exactly

#: Most plaintext bytes in one record (a large tensor is several records).
RECORD_BYTES = 1 << 20
_TAG_BYTES = 16
_LENGTH = struct.Struct(">I")


def channel_keys(secret: bytes, acceptor_nonce: bytes, connector_nonce: bytes, context: str) -> tuple[bytes, bytes]:
    """The (acceptor -> connector, connector -> acceptor) keys of one connection (HKDF-SHA256).

    ``context`` names the connection's purpose and the identities proven
    (e.g. ``"control|device 2"``), so keys of one connection are useless on
    any other.
    """
    material = HKDF(
        algorithm=hashes.SHA256(), length=64, salt=acceptor_nonce + connector_nonce,
        info=b"ecofl sealed channel v1|" + context.encode(),
    ).derive(secret)
    return material[:32], material[32:]


class SealedSocket:
    """A connected socket whose traffic is sealed with one key per direction.

    ``send_key`` seals what this end sends, ``recv_key`` opens what it
    receives. One thread may send while another receives; concurrent senders
    are serialised record by record (a message's framing is still the
    caller's to keep whole, as with a plain socket).
    """

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes):
        self.sock = sock
        self._seal, self._open = AESGCM(send_key), AESGCM(recv_key)
        self._sent = 0  # records sent: the nonce of the next one
        self._received = 0
        self._plain = bytearray()  # opened bytes not yet handed to the reader
        self._offset = 0
        # One record's buffer each way, reused: a fresh one per record was a page-faulted, zeroed megabyte.
        self._outgoing = bytearray(_LENGTH.size + RECORD_BYTES + _TAG_BYTES)
        self._incoming = bytearray(RECORD_BYTES + _TAG_BYTES)
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()

    # -- sending -------------------------------------------------------------------------

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        """Seal ``data`` into records and send them all (blocks like ``socket.sendall``)."""
        view = memoryview(data).cast("B")
        with self._send_lock:
            for start in range(0, len(view), RECORD_BYTES):
                chunk = view[start : start + RECORD_BYTES]
                record = memoryview(self._outgoing)[: _LENGTH.size + len(chunk) + _TAG_BYTES]
                _LENGTH.pack_into(record, 0, len(chunk) + _TAG_BYTES)
                self._seal.encrypt_into(_nonce(self._sent), chunk, bytes(record[: _LENGTH.size]),
                                        record[_LENGTH.size :])
                self._sent += 1
                self.sock.sendall(record)

    # -- receiving -----------------------------------------------------------------------

    def recv_into(self, buffer: bytearray | memoryview, nbytes: int = 0) -> int:
        """Fill up to ``nbytes`` (default: all) of ``buffer`` with opened bytes; 0 only at end of stream."""
        view = memoryview(buffer).cast("B")
        wanted = nbytes or len(view)
        with self._recv_lock:
            if not self.pending():
                direct = self._open_record(view[:wanted])
                if direct is not None:
                    return direct
            count = min(wanted, self.pending())
            view[:count] = self._plain[self._offset : self._offset + count]
            self._offset += count
            return count

    def pending(self) -> int:
        """Opened bytes waiting to be read (a selector cannot see them)."""
        return len(self._plain) - self._offset

    def _open_record(self, target: memoryview) -> int | None:
        """Receive and open the next record.

        A record that fits ``target`` is opened straight into it (its length
        is returned: large tensors are not copied twice); a larger one is
        kept for the following reads (None). 0 at a clean end of stream.
        """
        header = recv_exactly(self.sock, _LENGTH.size, allow_eof=True)
        if header is None:
            return 0
        (length,) = _LENGTH.unpack(header)
        if not _TAG_BYTES < length <= RECORD_BYTES + _TAG_BYTES:
            raise ChannelClosed(f"a record of {length} bytes is not a record of this channel")
        sealed = recv_exactly(self.sock, length, memoryview(self._incoming)[:length])
        size = length - _TAG_BYTES
        direct = len(target) >= size
        out = target[:size] if direct else bytearray(size)
        try:
            self._open.decrypt_into(_nonce(self._received), sealed, bytes(header), out)
        except InvalidTag:
            raise ChannelClosed("a record failed authentication: the channel was tampered with") from None
        self._received += 1
        if direct:
            return size
        self._plain, self._offset = out, 0
        return None

    # -- the rest of the socket ----------------------------------------------------------

    def fileno(self) -> int:
        return self.sock.fileno()

    def settimeout(self, value: float | None) -> None:
        self.sock.settimeout(value)

    def gettimeout(self) -> float | None:
        return self.sock.gettimeout()

    def getpeername(self):
        return self.sock.getpeername()

    def getsockname(self):
        return self.sock.getsockname()

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "SealedSocket":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _nonce(counter: int) -> bytes:
    return counter.to_bytes(12, "big")
