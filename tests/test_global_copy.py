"""The global copy's pieces (:mod:`ecofl.pipeline.runtime.global_copy`): how a stage is cut, sent and put together."""

import numpy as np
import pytest

from ecofl.pipeline.runtime.control_messages import CopyPiece
from ecofl.pipeline.runtime.errors import WorkerFailed
from ecofl.pipeline.runtime.global_copy import CopyAssembly, CopyUpload, copy_pieces


def arrays(**sizes: int) -> dict[str, np.ndarray]:
    return {key: np.full(n, i, dtype=np.uint8) for i, (key, n) in enumerate(sizes.items())}


def test_a_stage_is_cut_in_key_order_into_pieces_of_at_most_the_size_and_a_large_tensor_goes_alone():
    pieces = copy_pieces(arrays(c=40, a=30, b=50, d=200, e=10), 100)
    assert [sorted(p) for p in pieces] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert copy_pieces({}, 100) == [{}]  # a stage without state still says it is complete


def test_an_upload_sends_every_piece_in_order_and_marks_the_last():
    sent: list[tuple[CopyPiece, dict]] = []
    upload = CopyUpload(lambda piece, a: sent.append((piece, a)), 3, arrays(a=70_000, b=70_000, c=10), None)
    upload.finish(lambda: None)
    assert [p.version for p, _ in sent] == [3] * len(sent) and [p.last for p, _ in sent][-1]
    assert not any(p.last for p, _ in sent[:-1])
    assert set().union(*(a for _, a in sent)) == {"a", "b", "c"}
    assert upload.sent_after_s is not None and "global-copy" in upload.ended_cpu_s()


def test_a_stopped_upload_sends_nothing_more_and_a_failed_one_raises_on_finish():
    sent = []
    slow = CopyUpload(lambda piece, a: sent.append(piece), 1, arrays(a=200_000, b=200_000), link_bps=1e4)
    slow.stop()  # the link needs 40 s: stopped in its first piece's pacing
    assert not any(p.last for p in sent) and slow.sent_after_s is None

    def broken(piece, a):
        raise OSError("channel closed")

    failed = CopyUpload(broken, 1, arrays(a=10), None)
    with pytest.raises(OSError, match="channel closed"):
        failed.finish(lambda: None)


def test_the_portal_holds_a_copy_only_once_every_stage_sent_its_last_piece():
    assembly = CopyAssembly(5, {0: ["w0", "b0"], 2: ["w2"]})
    assembly.add(0, CopyPiece(5, last=False), {"w0": np.zeros(2)})
    assembly.add(0, CopyPiece(5, last=True), {"b0": np.ones(1)})
    with pytest.raises(RuntimeError, match=r"devices \[2\]"):
        assembly.result()
    assembly.add(2, CopyPiece(5, last=True), {"w2": np.ones(3)})
    assert sorted(assembly.result()) == ["b0", "w0", "w2"]


@pytest.mark.parametrize("device, piece, sent, why", [
    (0, CopyPiece(4, last=True), {"w0": np.zeros(1)}, "version 4"),  # another round's
    (1, CopyPiece(5, last=True), {"w0": np.zeros(1)}, "version 5"),  # a device not asked
    (0, CopyPiece(5, last=True), {"w2": np.zeros(1)}, "not of its stage"),
    (0, CopyPiece(5, last=True), {"w0": np.zeros(1)}, "lacks 1 tensors"),  # b0 never came
])
def test_a_piece_the_portal_did_not_ask_for_is_the_senders_failure(device, piece, sent, why):
    assembly = CopyAssembly(5, {0: ["w0", "b0"], 2: ["w2"]})
    with pytest.raises(WorkerFailed, match=why):
        assembly.add(device, piece, sent)
