"""The home's data plane: sealed channels, tensor links, epoch meshes, and strangers at the door.

In-process (threads) for the channel, the links and the ring all-reduce; one
real pipeline (worker processes) for "a client that connects to the tensor
transport's port without the secret learns nothing and disturbs nothing".
"""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest
import torch

from ecofl.net.auth import CONTROL, admit_peer, join_home
from ecofl.net.dial import dial
from ecofl.net.errors import ChannelClosed
from ecofl.net.framing import MAX_ARRAY_BYTES
from ecofl.net.links import DTYPES, HEADER, MAX_DIMS, MIGRATION_TAG, REPLICA_TAG, PeerLost
from ecofl.net.mesh import DataListener, EpochMesh, data_purpose
from ecofl.net.pacing import TokenBucket
from ecofl.net.sealed import RECORD_BYTES, SealedSocket, channel_keys
from ecofl.net.wire import LENGTH, recv_message, send_message
from ecofl.pipeline.runtime.byte_stream import (MAX_PIECE_BYTES, MIN_PIECE_BYTES, byte_pieces, end_to_end,
                                                in_stream_order, piece_bytes, stream_buffers, stream_keys)
from ecofl.pipeline.runtime.migration_io import exchange_layer_states
from ecofl.pipeline.runtime import replica
from ecofl.pipeline.runtime.replica import ReplicaExchange
from helpers import SECRET, answer_of, close_all, meshes, wait_for

pytestmark = pytest.mark.timeout(180)



def sealed_pair() -> tuple[SealedSocket, SealedSocket, socket.socket]:
    """Two ends of a sealed channel over a socketpair (and the device end's raw socket, to tamper with)."""
    portal_end, device_end = socket.socketpair()
    joined: list[SealedSocket] = []
    thread = threading.Thread(target=lambda: joined.append(join_home(device_end, SECRET, 3)))
    thread.start()
    portal = admit_peer(portal_end, SECRET).channel
    thread.join(timeout=10)
    return portal, joined[0], device_end


def test_sealed_channel_carries_messages_of_any_size_and_hides_them():
    portal, device, raw = sealed_pair()
    big = np.arange(3 * RECORD_BYTES // 4, dtype=np.float32)  # three records' worth
    sent = threading.Thread(target=send_message, args=(device, {"type": "weights"}, {"w": big, "s": np.float64(2)}))
    sent.start()
    header, arrays = recv_message(portal)
    sent.join()
    assert header == {"type": "weights"}
    np.testing.assert_array_equal(arrays["w"], big)
    assert arrays["s"].shape == () and arrays["s"] == 2.0
    portal.close(), device.close()


KEYS = channel_keys(SECRET, b"a" * 32, b"c" * 32, "test")


def sealed_records(*messages: bytes, keys=KEYS) -> list[bytes]:
    """What crosses the wire when one end sends ``messages`` (one record each)."""
    wire_in, wire_out = socket.socketpair()
    sender = SealedSocket(wire_in, keys[0], keys[1])
    records = []
    for message in messages:
        sender.sendall(message)
        records.append(wire_out.recv(1 << 16))
    sender.close(), wire_out.close()
    return records


def opened(raw: bytes, count: int) -> list[bytes]:
    """What the other end reads from ``raw`` bytes, ``count`` plaintexts of 5 bytes."""
    wire_in, wire_out = socket.socketpair()
    receiver = SealedSocket(wire_out, KEYS[1], KEYS[0])
    wire_in.sendall(raw)
    wire_in.close()
    out = []
    try:
        for _ in range(count):
            buffer = bytearray(5)
            assert receiver.recv_into(buffer) == 5
            out.append(bytes(buffer))
    finally:
        receiver.close()
    return out


def test_records_are_sealed_and_open_only_in_order_untouched():
    first, second = sealed_records(b"first", b"again")
    assert b"first" not in first and b"again" not in second  # the plaintext never crosses the wire
    assert opened(first + second, 2) == [b"first", b"again"]
    tampered = bytearray(first)
    tampered[-1] ^= 1
    with pytest.raises(ChannelClosed, match="failed authentication"):
        opened(bytes(tampered), 1)
    with pytest.raises(ChannelClosed, match="failed authentication"):
        opened(first + first, 2)  # replayed
    with pytest.raises(ChannelClosed, match="failed authentication"):
        opened(second + first, 2)  # reordered
    (foreign,) = sealed_records(b"first", keys=channel_keys(SECRET, b"x" * 32, b"y" * 32, "test"))
    with pytest.raises(ChannelClosed, match="failed authentication"):
        opened(foreign, 1)  # sealed for another connection


def test_links_carry_tagged_tensors_of_every_dtype_in_order_per_tag():
    listeners, (a, b) = meshes(2)
    try:
        sent = {
            0: torch.randn(3, 4),
            1: torch.arange(10, dtype=torch.int64),
            2: torch.randn(2, 2).to(torch.bfloat16),
            3: torch.tensor(True),
            4: torch.randn(1 << 19),  # 2 MiB: several records
            5: torch.empty(0, 7),
        }
        for tag, tensor in sent.items():
            a.send(1, tensor, tag)
        a.send(1, torch.full((2,), 7.0), 0)  # a second tensor under tag 0 queues behind the first
        for tag in reversed(sent):  # taken in any order of tags
            got = b.recv(0, tag)
            assert got.dtype == sent[tag].dtype and got.shape == sent[tag].shape
            assert torch.equal(got, sent[tag])
        assert torch.equal(b.recv(0, 0), torch.full((2,), 7.0))
    finally:
        close_all(listeners, [a, b])


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_all_reduce_gives_every_rank_the_same_sum(n):
    listeners, ranks = meshes(n)
    inputs = [torch.randn(1001, generator=torch.Generator().manual_seed(r)) for r in range(n)]
    given = [tensor.clone() for tensor in inputs]
    results: dict[int, torch.Tensor] = {}
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(
        r, ranks[r].all_reduce(given[r], tuple(range(n)), tag=99))) for r in range(n)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        expected = torch.stack(inputs).sum(0)
        for r in range(n):
            torch.testing.assert_close(results[r], expected)
            assert torch.equal(results[r], results[0])  # bitwise the same on every replica
            assert results[r] is given[r]  # summed in place: no copy of the whole tensor
    finally:
        close_all(listeners, ranks)


class CountingBucket(TokenBucket):
    """A link fast enough not to slow the test, which counts the bytes it lets out."""

    def __init__(self) -> None:
        super().__init__(1e12)
        self.sent = 0

    def reserve(self, nbytes: int) -> float:
        self.sent += nbytes
        return super().reserve(nbytes)


@pytest.mark.parametrize("n", [2, 3])
def test_a_paced_ring_all_reduce_sends_every_byte_through_the_ranks_link(n):
    """Asteroid eq. 5: each rank of a ring sends 2 (n - 1) / n of the tensor, all of it through its paced link
    (a replicated stage's all-reduce on emulated links was unpaced before, so data parallelism looked free)."""
    listeners, ranks = meshes(n)
    size = 3000  # divisible by n: every chunk the same
    buckets = [CountingBucket() for _ in range(n)]
    results: dict[int, torch.Tensor] = {}
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(r, ranks[r].all_reduce(
        torch.full((size,), float(r)), tuple(range(n)), tag=99, bucket=buckets[r]))) for r in range(n)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        for r in range(n):
            torch.testing.assert_close(results[r], torch.full((size,), float(sum(range(n)))))
            assert buckets[r].sent == 2 * (n - 1) * (size // n) * 4  # float32 bytes
    finally:
        close_all(listeners, ranks)


def test_closing_a_link_ends_a_wait_on_it_with_peer_lost():
    listeners, (a, b) = meshes(2)
    try:
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                b.recv(0, tag=5, timeout_s=60)
            except BaseException as error:  # noqa: BLE001
                errors.append(error)

        thread = threading.Thread(target=wait)
        thread.start()
        a.close()  # the peer's side goes away (a re-plan, or the peer died)
        thread.join(timeout=30)
        assert not thread.is_alive() and isinstance(errors[0], PeerLost)
        assert b.send(0, torch.ones(1), 0).done.wait(30)  # a later send fails instead of hanging
    finally:
        close_all(listeners, [a, b])


@pytest.mark.parametrize("dims", [[1 << 40, 1 << 40], [MAX_ARRAY_BYTES // 4 + 1], [-1]])
def test_a_tensor_header_announcing_absurd_bytes_fails_the_link_at_once(dims):
    """A peer (one that knows the secret: a buggy or compromised device) announcing a tensor of more bytes than a
    message carries, or overflowing 64 bits: the wait for it ends with PeerLost, nothing allocated, no timeout."""
    listeners, (a, b) = meshes(2)
    try:
        header = HEADER.pack(0.0, 5, DTYPES.index(torch.float32), len(dims), *dims, *[0] * (MAX_DIMS - len(dims)))
        a.links[1].channel.sendall(header)
        with pytest.raises(PeerLost, match="announced"):
            b.recv(0, tag=5, timeout_s=60)
    finally:
        close_all(listeners, [a, b])


@pytest.mark.parametrize("hold", [float("nan"), float("inf"), -1.0])
def test_a_tensor_header_with_no_time_to_hold_it_fails_the_link_at_once(hold):
    """A header whose hold is not a number of seconds would hold its tensor forever: the link fails instead."""
    listeners, (a, b) = meshes(2)
    try:
        a.links[1].channel.sendall(HEADER.pack(hold, 5, DTYPES.index(torch.float32), 1, 4, *[0] * (MAX_DIMS - 1)))
        with pytest.raises(PeerLost, match="malformed"):
            b.recv(0, tag=5, timeout_s=60)
    finally:
        close_all(listeners, [a, b])


def test_an_emulated_link_holds_a_tensor_at_the_receiver_not_the_sender():
    """A foreground post on an emulated link leaves its sender at once (one wake of its sender thread, not
    a sleep for the link's time and a second wake) and is handed out no sooner than the link could have
    carried it, posts back to back one link time after the other; its ticket ends when the link has."""
    listeners, (a, b) = meshes(2)
    try:
        link = TokenBucket(256 << 10, burst_bytes=0)  # 256 KiB/s: each post below takes a second
        posted = time.monotonic()
        tickets = [a.send(1, torch.full((64 << 10,), float(i)), 3, link) for i in range(2)]
        assert all(t.done.wait(30) for t in tickets)
        left_after = time.monotonic() - posted
        first = b.recv(0, 3)
        first_at = time.monotonic() - posted
        second = b.recv(0, 3)
        second_at = time.monotonic() - posted
        assert torch.equal(first, torch.zeros(64 << 10)) and torch.equal(second, torch.ones(64 << 10))
        assert first_at >= 1.0 and second_at >= 2.0  # the link's time, at the receiver
        assert left_after < 1.0  # the sender did not sleep out even the first post's
        assert tickets[1].end - tickets[0].start >= 2.0 - 0.01  # a ticket's end: when the link has carried it
    finally:
        close_all(listeners, [a, b])


def test_a_control_message_announcing_absurd_arrays_is_malformed():
    a, b, _ = sealed_pair()
    for listing in ([{"name": "w", "dtype": "<f4", "shape": [1 << 40, 1 << 40]}], [{"name": "w", "shape": [1]}],
                    [{"name": "w", "dtype": "<f4", "shape": [-2]}]):
        payload = json.dumps({"type": "x", "arrays": listing}).encode()
        a.sendall(LENGTH.pack(len(payload)) + payload)
        with pytest.raises(ValueError, match="announced|malformed"):
            recv_message(b)


def test_a_background_post_gives_way_to_the_pipelines_own_tensors():
    """A replica's pieces travel in the background of a link: an activation posted behind twenty of them
    leaves after at most the piece being sent, and each kind keeps its own order."""
    listeners, (a, b) = meshes(2)
    try:
        piece = 64 << 10
        link = TokenBucket(20 * piece, burst_bytes=0)  # twenty pieces: about a second on this link
        pieces = [torch.full((piece // 4,), float(i)) for i in range(20)]
        background = [a.send(1, t, REPLICA_TAG, link, background=True) for t in pieces]
        activation = a.send(1, torch.ones(8), 3, link)
        assert activation.done.wait(30) and all(t.done.wait(30) for t in background)
        assert sum(t.start < activation.start for t in background) <= 10  # not behind the queue
        assert torch.equal(b.recv(0, 3), torch.ones(8))
        assert all(torch.equal(b.recv(0, REPLICA_TAG), t) for t in pieces)  # in the order posted
    finally:
        close_all(listeners, [a, b])


def test_an_activation_overtakes_the_replica_piece_being_paced():
    """On an emulated link a background piece being paced steps aside: an activation posted while one is under
    way leaves before it (a whole piece is 50 ms of the link; here a second), and the piece still takes its time."""
    listeners, (a, b) = meshes(2)
    try:
        link = TokenBucket(256 << 10, burst_bytes=0)
        replica = a.send(1, torch.zeros(64 << 10), REPLICA_TAG, link, background=True)  # 256 KiB: a second
        wait_for(lambda: replica.start > 0, timeout_s=30, what="the sender to take the replica piece")
        activation = a.send(1, torch.ones(8), 3, link)
        assert activation.done.wait(30) and replica.done.wait(30)
        assert activation.end < replica.end and replica.error is None
        assert replica.end - replica.start >= 0.9  # 256 KiB at 256 KiB/s: what it carried before stepping aside
        # was kept, the rest carried after the activation, nothing carried twice or skipped
        assert torch.equal(b.recv(0, 3), torch.ones(8)) and b.recv(0, REPLICA_TAG).numel() == 64 << 10
    finally:
        close_all(listeners, [a, b])


def test_a_post_racing_the_close_of_its_link_fails_at_once():
    """The link closes between a post's check and its queueing, and the sender is already gone: the post fails
    at once instead of waiting out its timeout."""
    listeners, (a, b) = meshes(2)
    link = a.links[1]
    queue_put = link._outbox.put

    def close_first(entry) -> None:  # the close lands just before the post is queued
        link._outbox.put = queue_put
        link.close()
        link._sender.join(timeout=30)
        queue_put(entry)

    try:
        link._outbox.put = close_first
        ticket = a.send(1, torch.ones(4), 3)
        assert not link._sender.is_alive() and ticket.done.wait(10) and isinstance(ticket.error, PeerLost)
    finally:
        close_all(listeners, [a, b])


def test_closing_a_link_fails_the_posts_still_queued():
    listeners, (a, b) = meshes(2)
    try:
        slow = TokenBucket(64 << 10, burst_bytes=0)  # a second per piece
        tickets = [a.send(1, torch.zeros(16 << 10), REPLICA_TAG, slow, background=True) for _ in range(10)]
        a.close()
        assert all(t.done.wait(30) for t in tickets)  # none is left waiting for its timeout
        assert isinstance(tickets[-1].error, PeerLost)
    finally:
        close_all(listeners, [a, b])


def test_replica_pieces_are_what_the_link_carries_in_a_moment():
    assert piece_bytes(TokenBucket(12.5e6)) == 2_500_000  # 100 Mbps: 200 ms
    assert piece_bytes(TokenBucket(12.5e6), piece_s=0.05) == 625_000
    assert piece_bytes(TokenBucket(1e5)) == MIN_PIECE_BYTES and piece_bytes(None) == MAX_PIECE_BYTES
    state = {"a": torch.randn(2, 50), "b": torch.zeros(3, dtype=torch.int64), "c": torch.zeros(0), "d": torch.ones(1)}
    cut = byte_pieces([state[k] for k in "abcd"], 160)
    assert [p.numel() for p in cut] == [160, 160, 108] and all(p.dtype == torch.uint8 for p in cut)
    assert cut[0].data_ptr() == state["a"].data_ptr()  # within one tensor: a view, nothing copied
    assert torch.equal(torch.cat(cut), torch.cat([state[k].reshape(-1).view(torch.uint8) for k in "abcd"]))
    assert [p.numel() for p in byte_pieces([torch.zeros(0)], 8)] == [0] and byte_pieces([], 8)[0].numel() == 0


def test_a_link_opens_byte_pieces_straight_into_the_buffer_announced_for_their_tag_and_hands_it_out_full():
    listeners, (a, b) = meshes(2)
    block = torch.zeros(100, dtype=torch.uint8)
    try:
        assert b.receive_into(0, REPLICA_TAG, [block])
        for value, size in ((1, 60), (2, 40)):  # fills it exactly
            a.send(1, torch.full((size,), value, dtype=torch.uint8), REPLICA_TAG)
        whole = b.recv(0, REPLICA_TAG)  # one hand-out for both pieces: the buffer itself
        assert whole.data_ptr() == block.data_ptr() and whole.numel() == 100
        assert torch.equal(block, torch.tensor([1] * 60 + [2] * 40, dtype=torch.uint8))
        a.send(1, torch.full((10,), 3, dtype=torch.uint8), REPLICA_TAG)  # the buffer is full: new memory
        assert b.recv(0, REPLICA_TAG).data_ptr() != block.data_ptr() + 100 and block[-1] == 2
        other = torch.zeros(8, dtype=torch.uint8)
        assert b.receive_into(0, REPLICA_TAG, [other])
        a.send(1, torch.full((2,), 4.0), REPLICA_TAG)  # not bytes: new memory, the buffer waits
        a.send(1, torch.full((6,), 5, dtype=torch.uint8), REPLICA_TAG)  # opened into it, not handed out yet
        a.send(1, torch.full((16,), 6, dtype=torch.uint8), REPLICA_TAG)  # more than it has room for
        assert torch.equal(b.recv(0, REPLICA_TAG), torch.full((2,), 4.0))
        part = b.recv(0, REPLICA_TAG)  # what was filled, then the piece that did not fit, in new memory
        assert part.data_ptr() == other.data_ptr() and torch.equal(part, torch.full((6,), 5, dtype=torch.uint8))
        assert torch.equal(b.recv(0, REPLICA_TAG), torch.full((16,), 6, dtype=torch.uint8))
        last = torch.zeros(8, dtype=torch.uint8)
        assert b.receive_into(0, REPLICA_TAG, [last])
        b.forget(0, REPLICA_TAG, last)  # a receive that ended early: nothing goes there
        a.send(1, torch.full((8,), 7, dtype=torch.uint8), REPLICA_TAG)
        assert b.recv(0, REPLICA_TAG).data_ptr() != last.data_ptr() and not last.any()
        a.send(1, torch.full((8,), 8, dtype=torch.uint8), REPLICA_TAG)
        wait_for(lambda: b._link(0)._inbox[REPLICA_TAG], 30)
        assert not b.receive_into(0, REPLICA_TAG, [last])  # a piece came first: its stream would land misplaced
        assert torch.equal(b.recv(0, REPLICA_TAG), torch.full((8,), 8, dtype=torch.uint8)) and not last.any()
    finally:
        close_all(listeners, [a, b])


def test_a_replica_whose_first_piece_came_before_its_buffers_were_announced_is_copied_in_whole():
    listeners, (a, b) = meshes(2)
    state = {"w": torch.randn(50_000), "b": torch.randn(7), "count": torch.tensor(3)}
    sent, buffers = stream_buffers(state), stream_buffers(state)
    for key, value in state.items():
        sent[key].copy_(value)
    kept: list[dict[str, torch.Tensor]] = []
    try:  # the sender's round starts first: a piece waits at the receiver, the rest keeps coming
        sender = ReplicaExchange(a, [(1, sent)], [], {1: TokenBucket(5e5)}, kept.append)
        wait_for(lambda: b._link(0)._inbox[REPLICA_TAG], 30)
        receiver = ReplicaExchange(b, [], [(0, buffers)], {}, kept.append)
        sender.finish(lambda: None)
        receiver.finish(lambda: None)
        assert len(sender.tickets) > 2 and kept == [buffers]
        assert all(torch.equal(buffers[k], state[k]) for k in state)
    finally:
        close_all(listeners, [a, b])


def test_stream_buffers_lie_end_to_end_in_stream_order_each_tensor_at_a_multiple_of_its_element_size():
    # a batch norm of an odd length, its int64 count, a mask: the count goes first, the mask last
    state = {"bn.b": torch.randn(3), "bn.count": torch.tensor(7), "mask": torch.tensor([True, False]),
             "w": torch.randn(2, 3)}
    assert stream_keys(state) == ["bn.count", "bn.b", "w", "mask"]
    laid = stream_buffers(state)
    assert {k: (v.shape, v.dtype) for k, v in laid.items()} == {k: (v.shape, v.dtype) for k, v in state.items()}
    block = end_to_end(in_stream_order(laid))
    assert block is not None and block.numel() == 8 + 12 + 24 + 2
    assert [laid[k].data_ptr() - block.data_ptr() for k in stream_keys(state)] == [0, 8, 20, 44]
    pieces = byte_pieces(in_stream_order(laid), 16)  # across tensors, yet views of the block: nothing gathered
    assert [p.data_ptr() - block.data_ptr() for p in pieces] == [0, 16, 32] and pieces[-1].numel() == 14
    assert end_to_end([torch.randn(4), torch.randn(4)]) is None  # tensors of their own


def test_a_replica_into_buffers_laid_end_to_end_arrives_whole_and_in_place():
    listeners, (a, b) = meshes(2)
    state = {"w": torch.randn(100_000), "b": torch.randn(3, 5), "count": torch.tensor(7),
             "mask": torch.tensor([True, False, True]), "n": torch.zeros(0)}
    sent, buffers = stream_buffers(state), stream_buffers(state)
    for key, value in state.items():
        sent[key].copy_(value)
    kept: list[dict[str, torch.Tensor]] = []
    link, opened_in_block = b._link(0), []
    room_for = link._room_for
    link._room_for = lambda *args: opened_in_block.append(room := room_for(*args)) or room
    taken, take = [], link.take
    link.take = lambda *args: taken.append(piece := take(*args)) or piece
    try:
        receiver = ReplicaExchange(b, [], [(0, buffers)], {}, kept.append)
        sender = ReplicaExchange(a, [(1, sent)], [], {1: TokenBucket(1e6)}, kept.append)
        sender.finish(lambda: None)
        receiver.finish(lambda: None)
        assert kept == [buffers] and all(torch.equal(buffers[k], state[k]) for k in state)
        block = end_to_end(in_stream_order(buffers))
        assert len(opened_in_block) == len(sender.tickets) > 1  # every piece opened into the block, in order
        assert [room.data_ptr() - block.data_ptr() for room, _ in opened_in_block] == [
            i * piece_bytes(TokenBucket(1e6)) for i in range(len(opened_in_block))]
        assert [piece.data_ptr() for piece in taken] == [block.data_ptr()]  # the receiver woke once, for it all
    finally:
        close_all(listeners, [a, b])


def test_a_replica_is_cut_into_pieces_and_kept_only_once_all_of_it_arrived():
    listeners, (a, b) = meshes(2)
    # a stage's state: weights, a batch norm's few bytes and its int64 count, an empty tensor
    state = {"w": torch.randn(100_000), "b": torch.randn(3, 5), "n": torch.zeros(0), "count": torch.tensor(7),
             "mask": torch.tensor([True, False, True])}
    kept: list[dict[str, torch.Tensor]] = []
    try:
        receiver = ReplicaExchange(b, [], [(0, {k: torch.empty_like(v) for k, v in state.items()})], {}, kept.append)
        # paced at 1 MB/s: the state as one stream of bytes in pieces of 200 kB (not a message per tensor); the
        # receiver fills its buffers from pieces of whatever size comes, across the tensors' boundaries
        sender = ReplicaExchange(a, [(1, state)], [], {1: TokenBucket(1e6)}, kept.append)
        assert len(sender.tickets) == -(-(400_000 + 60 + 8 + 3) // piece_bytes(TokenBucket(1e6))) == 3
        sender.finish(lambda: None)
        receiver.finish(lambda: None)
        [replica] = kept
        assert all(torch.equal(replica[k], state[k]) for k in state) and receiver.complete_after_s is not None
        waiting = ReplicaExchange(b, [], [(0, {"w": torch.empty(10)})], {}, kept.append)  # nothing will come
        waiting.stop()
        assert len(kept) == 1 and waiting.complete_after_s is None  # an interrupted replica is not kept
    finally:
        close_all(listeners, [a, b])


def test_stopping_a_replica_exchange_wakes_its_receiver_rather_than_waiting_for_its_next_check(monkeypatch):
    monkeypatch.setattr(replica, "STOP_CHECK_S", 3600.0)  # unwoken, the receiver would check in an hour
    listeners, (a, b) = meshes(2)
    kept: list[dict[str, torch.Tensor]] = []
    try:
        waiting = ReplicaExchange(b, [], [(0, {"w": torch.empty(10)}), (0, {"v": torch.empty(3)})], {}, kept.append)
        wait_for(lambda: b._link(0)._buffers[REPLICA_TAG], 10)  # announced: the receiver is waiting
        stopping = threading.Thread(target=waiting.stop)
        stopping.start()
        stopping.join(60)
        assert not stopping.is_alive() and kept == []
        assert not b._link(0)._buffers[REPLICA_TAG]  # neither buffer stays announced
    finally:
        close_all(listeners, [a, b])


def test_a_replica_piece_that_does_not_fit_fails_the_exchange_and_nothing_is_kept():
    listeners, (a, b) = meshes(2)
    kept: list[dict[str, torch.Tensor]] = []
    try:
        receiver = ReplicaExchange(b, [], [(0, {"w": torch.empty(10)})], {}, kept.append)
        a.send(1, torch.zeros(24, dtype=torch.uint8), REPLICA_TAG)
        a.send(1, torch.zeros(24, dtype=torch.uint8), REPLICA_TAG)  # 48 bytes for a buffer of 40
        with pytest.raises(ValueError, match="16 bytes were left to fill"):
            receiver.finish(lambda: None)
        floats = ReplicaExchange(b, [], [(0, {"w": torch.empty(10)})], {}, kept.append)
        a.send(1, torch.zeros(10), REPLICA_TAG)  # the right size, but not bytes
        with pytest.raises(ValueError, match="torch.float32 .10,. replica piece: 40 bytes were left"):
            floats.finish(lambda: None)
        assert kept == []
    finally:
        close_all(listeners, [a, b])


def test_a_migration_moves_layers_both_ways_at_once_as_streams_of_bytes():
    listeners, (a, b) = meshes(2)
    # what a MobileNetV2 layer holds: a convolution's weights and a batch norm's few bytes and its int64 count
    layer = {"conv.w": torch.randn(64, 32, 3, 3), "bn.w": torch.randn(64), "bn.b": torch.randn(64),
             "bn.count": torch.tensor(5), "bn.mean": torch.randn(64)}
    other = {k: v + 1 for k, v in layer.items()}
    posted: list[int] = []
    for mesh in (a, b):
        send = mesh.send
        mesh.send = lambda *args, send=send, **kw: posted.append(1) or send(*args, **kw)
    filled: dict[str, dict[str, torch.Tensor]] = {}
    received: dict[str, int] = {}

    def exchange(name: str, mesh: EpochMesh, state: dict, peer: int) -> None:
        filled[name] = {k: torch.empty_like(v) for k, v in state.items()}
        received[name] = exchange_layer_states(mesh, [(peer, other if name == "a" else layer)],
                                               [(peer, filled[name])], MIGRATION_TAG, rate_bps=50e6)

    try:
        threads = [threading.Thread(target=exchange, args=("a", a, layer, 1)),
                   threading.Thread(target=exchange, args=("b", b, layer, 0))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        nbytes = sum(v.numel() * v.element_size() for v in layer.values())
        assert received == {"a": nbytes, "b": nbytes}
        assert all(torch.equal(filled["a"][k], layer[k]) and torch.equal(filled["b"][k], other[k]) for k in layer)
        assert len(posted) == 2 * -(-nbytes // piece_bytes(TokenBucket(50e6)))  # pieces, not a message per tensor
        b.send(0, torch.zeros(8, dtype=torch.uint8), MIGRATION_TAG)  # 8 bytes where a whole layer is expected
        b.send(0, torch.zeros(nbytes, dtype=torch.uint8), MIGRATION_TAG)
        with pytest.raises(ValueError, match=f"rank 1 sent a torch.uint8 .{nbytes},. migration piece: "
                                             f"{nbytes - 8} bytes were left"):
            exchange_layer_states(a, [], [(1, {k: torch.empty_like(v) for k, v in layer.items()})], MIGRATION_TAG)
    finally:
        close_all(listeners, [a, b])


def stranger_visits(address: tuple[str, int], hello: dict) -> object:
    """Connect to a data port and send ``hello`` right away, as a stranger would: what comes back."""
    with socket.create_connection(address, timeout=10) as sock:
        send_message(sock, hello)
        return answer_of(sock)


def test_a_stranger_at_the_data_port_gets_nothing_at_all():
    listener = DataListener("127.0.0.1", SECRET)
    try:
        forged = {"type": "hello", "device": 1, "purpose": data_purpose(0, 0), "nonce": "00" * 32, "mac": "00" * 32}
        assert stranger_visits(listener.address, forged) == "closed"  # no knock: not even a challenge
        # someone with the secret but knocking for another kind of channel is refused too
        with pytest.raises(ChannelClosed):
            dial(listener.address, SECRET, 1, CONTROL)
        with socket.create_connection(listener.address, timeout=10) as sock:
            sock.sendall(b"\xff" * 64)  # garbage, and the connection ends
        wait_for(lambda: listener.refused == 3, timeout_s=30, what="three refusals")
    finally:
        listener.close()


def test_a_silent_stranger_does_not_hold_up_the_mesh():
    listeners = [DataListener("127.0.0.1", SECRET) for _ in range(2)]
    loiterer = socket.create_connection(listeners[0].address, timeout=10)  # connects and says nothing
    try:
        addresses = [listener.address for listener in listeners]
        built: dict[int, EpochMesh] = {}
        threads = [threading.Thread(target=lambda r=r: built.__setitem__(
            r, EpochMesh(listeners[r], SECRET, 4, r, addresses, timeout_s=30))) for r in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        built[1].send(0, torch.ones(3), 0)
        assert torch.equal(built[0].recv(1, 0), torch.ones(3))
    finally:
        loiterer.close()
        close_all(listeners, built.values())


def test_a_stranger_at_a_workers_data_port_learns_nothing_and_disturbs_nothing():
    """A running pipeline: silent connections, forged hellos and garbage at every worker's data port."""
    from ecofl.pipeline.plan import Plan, StagePlan
    from ecofl.pipeline.runtime import HomePipeline
    from pipeline_kit import WITHOUT_BATCH_NORM, assert_same, data, pool, single_process

    plan = Plan("hand", (StagePlan((0, 1), (0,), (4,), 5), StagePlan((2, 3), (1,), (4,), 3),
                         StagePlan((4, 4), (2,), (4,), 1)), micro_batch=4, num_micro_batches=4)
    x, y = data()
    model, _ = WITHOUT_BATCH_NORM.build()
    start = [p.detach().numpy().copy() for p in model.state_dict().values()]
    seen: list[object] = []
    with HomePipeline(WITHOUT_BATCH_NORM, pool(3), plan, emulate="none") as home:
        ports = list(home.data_ports.values())
        loiterers = [socket.create_connection(port, timeout=10) for port in ports]
        stop = threading.Event()

        def visit() -> None:
            while not stop.is_set():
                for rank, port in enumerate(ports):
                    hello = {"type": "hello", "device": rank, "purpose": data_purpose(0, (rank + 1) % 3),
                             "nonce": "11" * 32, "mac": "22" * 32}
                    seen.append(stranger_visits(port, hello))
                    with socket.create_connection(port, timeout=10) as sock:
                        sock.sendall(b"\x00" * 4096)

        visitor = threading.Thread(target=visit)
        visitor.start()
        try:
            result = home.train(start, x, y, sync_rounds=6, lr=0.1)
        finally:
            stop.set()
            visitor.join(timeout=60)
            for sock in loiterers:
                sock.close()
    assert_same(single_process(WITHOUT_BATCH_NORM, start, x, y, plan, 6, 0.1), result.weights)
    assert seen, "the stranger never got to the door"
    assert set(seen) == {"closed"}  # not a word: nothing about the home
