"""The home's data plane: every worker of a pipeline epoch linked to every other by an authenticated, sealed link.

A worker opens one :class:`DataListener` when it joins the home (on the
address it reaches the portal from) and reports its port to the portal. For
each *pipeline epoch* (the first plan, then every re-plan after a device
left, joined or slowed down) the portal sends every worker the epoch's ranks
and their addresses, and each worker builds an :class:`EpochMesh`: it
connects to every lower rank and waits for every higher rank to connect to
it. Every connection proves the home's secret for exactly that epoch and
pair (purpose ``"data epoch E to rank R"``, :mod:`.auth`) before the listener
hands it to anyone, and continues sealed (:mod:`.sealed`): a stranger who
reaches the port gets a random challenge and nothing else, and cannot slow
down the others (the port is a :class:`~.door.Door`: handshakes on threads
of their own, each with a deadline, bounded in number). Entering a new epoch
closes the old epoch's links, which ends any wait on a peer that froze or
died.

On the mesh, :meth:`EpochMesh.send` / :meth:`EpochMesh.recv` move tagged
tensors point to point (:mod:`.links`), and :meth:`EpochMesh.all_reduce` sums
a tensor over a replicated stage's devices with a ring (reduce-scatter, then
all-gather: 2(n-1)/n of the tensor on each link, the cost Asteroid eq. 5
charges, and bitwise-identical results on every replica).
"""

from __future__ import annotations

import re
import threading
import time

import torch

from ecofl.net.auth import Admitted
from ecofl.net.dial import RETRY_PAUSE_S, Unreachable, dial
from ecofl.net.door import Door
from ecofl.net.errors import ChannelClosed
from ecofl.net.links import POLL_S, AbortCheck, PeerLink, PeerLost, Ticket, never_aborted
from ecofl.net.pacing import TokenBucket
from ecofl.net.sealed import SealedSocket

_PURPOSE = re.compile(r"data epoch (\d+) to rank (\d+)")


def data_purpose(epoch: int, to_rank: int) -> str:
    """What a tensor link's handshake proves it is for (the connecting rank is the claimed device)."""
    return f"data epoch {epoch} to rank {to_rank}"


class DataListener:
    """A worker's door for tensor links: admits only peers that prove the home's secret (a context manager).

    Admitted links wait here, filed by (epoch, from rank, to rank), until the
    worker's :class:`EpochMesh` of that epoch claims them; a link for an
    epoch the worker has already left is closed.
    """

    def __init__(self, host: str, secret: bytes):
        self._admitted: dict[tuple[int, int, int], SealedSocket] = {}
        self._arrived = threading.Condition()
        self._oldest_epoch = 0
        self._closed = False
        self._door = Door(host, 0, secret, lambda purpose: _PURPOSE.fullmatch(purpose) is not None, self._file,
                          name="data")

    @property
    def address(self) -> tuple[str, int]:
        return self._door.address

    @property
    def refused(self) -> int:
        """Peers that did not prove the secret for a data link."""
        return self._door.refused

    def _file(self, admitted: Admitted) -> None:
        """File an admitted link until its epoch's mesh claims it (one of an epoch already left is closed)."""
        match = _PURPOSE.fullmatch(admitted.purpose)
        epoch, to_rank = int(match.group(1)), int(match.group(2))
        with self._arrived:
            if epoch < self._oldest_epoch or self._closed:
                admitted.channel.close()
                return
            old = self._admitted.pop((epoch, admitted.device, to_rank), None)
            if old is not None:
                old.close()
            self._admitted[(epoch, admitted.device, to_rank)] = admitted.channel
            self._arrived.notify_all()

    def claim(self, epoch: int, from_rank: int, to_rank: int, deadline: float,
              abort: AbortCheck = never_aborted) -> SealedSocket:
        """The link ``from_rank`` opened to ``to_rank`` for ``epoch``; PeerLost if none by ``deadline`` (monotonic)."""
        with self._arrived:
            while (epoch, from_rank, to_rank) not in self._admitted:
                if time.monotonic() > deadline:
                    raise PeerLost(f"rank {from_rank} did not open its link of epoch {epoch}")
                self._arrived.wait(POLL_S)
                abort()
            return self._admitted.pop((epoch, from_rank, to_rank))

    def forget_before(self, epoch: int) -> None:
        """Close the links of epochs before ``epoch`` that nobody claimed (and refuse later ones)."""
        with self._arrived:
            self._oldest_epoch = max(self._oldest_epoch, epoch)
            for key in [k for k in self._admitted if k[0] < epoch]:
                self._admitted.pop(key).close()

    def close(self) -> None:
        self._door.close()
        with self._arrived:
            self._closed = True
            for channel in self._admitted.values():
                channel.close()
            self._admitted.clear()

    def __enter__(self) -> "DataListener":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EpochMesh:
    """The tensor links of one pipeline epoch: this worker (``rank``) to every other rank of ``addresses``."""

    def __init__(self, listener: DataListener, secret: bytes, epoch: int, rank: int,
                 addresses: list[tuple[str, int]], timeout_s: float, abort: AbortCheck = never_aborted):
        """Link to every rank (``abort`` is checked while a peer is awaited: a peer that died never comes);
        ``linking_s``: how long that took (the slowest peer to connect or to be connected to)."""
        self.epoch, self.rank, self.timeout_s = epoch, rank, timeout_s
        self.links: dict[int, PeerLink] = {}
        listener.forget_before(epoch)
        started = time.monotonic()
        deadline = started + timeout_s
        try:
            for peer in range(rank):  # I open the links to lower ranks ...
                channel = _connect(tuple(addresses[peer]), secret, rank, data_purpose(epoch, peer), deadline, abort)
                self.links[peer] = PeerLink(channel, peer)
            for peer in range(rank + 1, len(addresses)):  # ... and higher ranks open theirs to me
                self.links[peer] = PeerLink(listener.claim(epoch, peer, rank, deadline, abort), peer)
        except BaseException:
            self.close()
            raise
        self.linking_s = time.monotonic() - started

    def send(self, dst: int, tensor: torch.Tensor, tag: int, bucket: TokenBucket | None = None,
             background: bool = False) -> Ticket:
        """Post ``tensor`` to rank ``dst`` under ``tag``; see :meth:`.links.PeerLink.post`."""
        return self._link(dst).post(tensor, tag, bucket, background)

    def receive_into(self, src: int, tag: int, buffers: list[torch.Tensor]) -> bool:
        """Open rank ``src``'s byte pieces under ``tag`` into ``buffers``; see :meth:`.links.PeerLink.receive_into`."""
        return self._link(src).receive_into(tag, buffers)

    def forget(self, src: int, tag: int, buffer: torch.Tensor) -> None:
        """Open nothing more into ``buffer``; see :meth:`.links.PeerLink.forget`."""
        self._link(src).forget(tag, buffer)

    def recv(self, src: int, tag: int, timeout_s: float | None = None, abort: AbortCheck = never_aborted,
             poll_s: float = POLL_S) -> torch.Tensor:
        """The next tensor rank ``src`` sent under ``tag``; see :meth:`.links.PeerLink.take`."""
        return self._link(src).take(tag, self.timeout_s if timeout_s is None else timeout_s, abort, poll_s)

    def wake(self, src: int) -> None:
        """Have every wait for rank ``src``'s tensors check its abort now."""
        self._link(src).wake()

    def all_reduce(self, tensor: torch.Tensor, ranks: tuple[int, ...], tag: int,
                   abort: AbortCheck = never_aborted, bucket: TokenBucket | None = None) -> torch.Tensor:
        """Sum ``tensor`` (1-D) over ``ranks`` (this rank among them) with a ring, in place: every rank's
        ``tensor`` holds the same sum on return (and is returned). Only the chunks sent are copied, as a send
        may still be in flight when its chunk changes; on a slow device each copy of a stage's gradients is a
        visible part of its all-reduce.

        ``bucket`` paces this rank's sends (an emulated link; None: the kernel's pace).

        Reduce-scatter: in step k, position i sends chunk (i - k) mod n to the
        next position and adds the chunk (i - k - 1) mod n it receives; after
        n - 1 steps it holds the full sum of chunk (i + 1) mod n. All-gather
        passes the summed chunks around the ring in n - 1 more steps.
        """
        n = len(ranks)
        if n == 1:
            return tensor
        position = ranks.index(self.rank)
        after, before = ranks[(position + 1) % n], ranks[(position - 1) % n]
        chunks = torch.tensor_split(tensor, n)  # views of tensor
        tickets = []
        for step in range(n - 1):
            tickets.append(self.send(after, chunks[(position - step) % n].clone(), tag, bucket))
            chunks[(position - step - 1) % n].add_(self.recv(before, tag, abort=abort))
        for step in range(n - 1):
            tickets.append(self.send(after, chunks[(position - step + 1) % n].clone(), tag, bucket))
            chunks[(position - step) % n].copy_(self.recv(before, tag, abort=abort))
        for ticket in tickets:
            ticket.wait(self.timeout_s, abort, "the stage's all-reduce")
        return tensor

    def _link(self, rank: int) -> PeerLink:
        try:
            return self.links[rank]
        except KeyError:
            raise PeerLost(f"rank {rank} is not in epoch {self.epoch}") from None

    def close(self) -> None:
        """Close every link (threads blocked on them end with PeerLost)."""
        for link in self.links.values():
            link.close()


def _connect(address: tuple[str, int], secret: bytes, rank: int, purpose: str, deadline: float,
             abort: AbortCheck = never_aborted) -> SealedSocket:
    """Connect to a peer's data listener and prove the secret as ``rank`` for ``purpose``; retry until ``deadline``,
    also after a handshake the peer's door broke off (it turns a knock away while strangers' handshakes fill its
    places, :class:`~ecofl.net.door.Door`)."""
    while True:
        try:
            channel = dial(address, secret, rank, purpose, retry_for_s=max(0.0, deadline - time.monotonic()),
                           abort=abort)
            break
        except Unreachable as error:
            raise PeerLost(f"the data port is down: {error}") from None
        except (ChannelClosed, OSError) as error:
            if time.monotonic() + RETRY_PAUSE_S >= deadline:
                raise PeerLost(f"the data link to {address[0]}:{address[1]} broke during its handshake: {error}"
                               ) from None
        time.sleep(RETRY_PAUSE_S)
        abort()
    channel.settimeout(None)
    return channel
