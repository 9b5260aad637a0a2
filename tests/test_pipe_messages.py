"""The pipes between a home's processes and the helpers they start carry typed messages, checked on receipt as
every network message is (ecofl.pipeline.runtime.pipe_messages)."""

from __future__ import annotations

import io

import pytest

from ecofl.net.schema import MalformedMessage
from ecofl.pipeline.runtime.pipe_messages import (CALIBRATION_REPLIES, CALIBRATION_REQUESTS, FORK_REPLIES,
                                                  FORK_REQUESTS, SESSION_REPLIES, SESSION_REQUESTS, Exited, Fork,
                                                  Forked, ForkFailed, Go, Session, SessionFree, Timed, line_of,
                                                  read_line, write_line)

EVERY = [
    (Fork(3, ["--portal", "x"], {"A": "1"}, "/tmp/log", "ecofl-device1", ["/sys/fs/cgroup/x/cgroup.procs"], None),
     FORK_REQUESTS),
    (Forked(3, 4242), FORK_REPLIES), (ForkFailed(3, "EAGAIN"), FORK_REPLIES), (Exited(4242, -9), FORK_REPLIES),
    (Session(("10.0.0.1", 7000), 2), SESSION_REQUESTS), (SessionFree(), SESSION_REPLIES),
    (Go(), CALIBRATION_REQUESTS), (Timed(None), CALIBRATION_REPLIES), (Timed(0.0125), CALIBRATION_REPLIES),
]


@pytest.mark.parametrize("sent, accepted", EVERY, ids=[type(m).__name__ for m, _ in EVERY])
def test_every_pipe_message_arrives_as_it_was_sent_as_one_line(sent, accepted):
    stream = io.StringIO()
    write_line(stream, sent)
    assert stream.getvalue().count("\n") == 1 and stream.getvalue() == line_of(sent)
    assert read_line(stream.getvalue(), accepted) == sent
    assert read_line(stream.getvalue().encode(), accepted) == sent  # the fork server reads bytes


@pytest.mark.parametrize("line, accepted, why", [
    ('{"type": "forked", "id": 3, "pid": "4242"}', FORK_REPLIES, "forked.pid: expected an integer"),
    ('{"type": "exited", "pid": 4242}', FORK_REPLIES, "missing field 'code'"),
    ('{"type": "timed", "seconds_per_step": NaN}', CALIBRATION_REPLIES,
     "timed.seconds_per_step: expected a finite number"),
    ('{"type": "go"}', CALIBRATION_REPLIES, "unknown message type 'go'"),
    ('{"type": "session", "portal": ["h", 1], "device": 1, "secret": "x"}', SESSION_REQUESTS, "unknown field"),
    ("ready", SESSION_REPLIES, "not a message: 'ready'"),
])
def test_a_line_that_is_not_one_of_the_pipes_messages_is_refused_naming_why(line, accepted, why):
    with pytest.raises(MalformedMessage, match=why):
        read_line(line, accepted)
