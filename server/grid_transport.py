"""The event loop's :class:`~ecofl.fl.transport.Transport` over a Flower ``Grid``.

Homes are named by partition id in the event loop and by node id in Flower;
node ids are random per run, so :meth:`GridTransport.connect` first waits
for the nodes, sends every node a query and keeps the partition-id -> node-id
map from the replies. After that ``query`` and ``train`` push one message
per home, poll ``pull_messages`` until every reply is in or the deadline
passes, and return the replies in whatever order they came; a home that did
not answer in time is simply missing (a straggler), and a home that answered
with an error comes back as ``TrainReply.error``. ``submit`` pushes and
returns; ``collect`` polls for whatever has arrived since (the wall clock's
arrival order).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence

from flwr.app import Message, MessageType
from flwr.serverapp import Grid

import protocol
from ecofl.fl.transport import HomeReport, RunStopped, TrainReply, TrainTask

log = logging.getLogger(__name__)


class GridTransport:
    """Reach homes through ``grid``; ``setup_json`` (a :class:`ecofl.fl.federation_setup.FederationSetup`) goes with every message.

    A query waits at most ``query_timeout_s`` for its replies, a training
    task ``reply_timeout_s``. Setting ``stop`` (Ctrl-C) ends any wait with
    :class:`~ecofl.fl.transport.RunStopped` within ``poll_interval_s``.
    """

    def __init__(
        self,
        grid: Grid,
        setup_json: str,
        num_homes: int,
        *,
        query_timeout_s: float = 60.0,
        reply_timeout_s: float = 600.0,
        poll_interval_s: float = 0.02,
        train_config: dict | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.grid = grid
        self.setup_json = setup_json
        self.num_homes = num_homes
        self.query_timeout_s = query_timeout_s
        self.reply_timeout_s = reply_timeout_s
        self.poll_interval_s = poll_interval_s
        self.stop = stop or threading.Event()
        self.train_config = dict(train_config or {})  # sent with queries: homes without a latency model probe
        self.node_of: dict[int, int] = {}  # partition id -> node id
        self._profiled: dict[int, HomeReport] = {}  # what connect learned at virtual time 0
        self._submitted: dict[str, tuple[TrainTask, float]] = {}  # message id -> (task, monotonic push time)
        self._undelivered: list[tuple[TrainTask, TrainReply]] = []  # submitted but not pushed: errors to collect

    def connect(self, timeout_s: float = 300.0) -> list[HomeReport]:
        """Wait for ``num_homes`` nodes, query them all and map partition ids to node ids.

        Returns the reports (at virtual time 0). Raises ``TimeoutError`` when
        fewer nodes connect in time, ``RuntimeError`` when two nodes claim one
        partition id or a node reports a partition id outside the federation.
        """
        deadline = time.monotonic() + timeout_s
        node_ids = sorted(self.grid.get_node_ids())
        while len(node_ids) < self.num_homes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(node_ids)} of {self.num_homes} homes connected in {timeout_s:.0f} s")
            self._sleep(0.5)
            node_ids = sorted(self.grid.get_node_ids())
        messages = {
            node: Message(protocol.query_content(self.setup_json, 0.0, self.train_config), node, MessageType.QUERY)
            for node in node_ids
        }
        replies = self._exchange(messages, max(deadline - time.monotonic(), 1.0))
        reports = []
        for node, reply in replies.items():
            if reply.has_error():
                log.warning("node %d could not be profiled: %s", node, reply.error.reason)
                continue
            report = protocol.read_report(reply)
            if not 0 <= report.home < self.num_homes:
                raise RuntimeError(f"node {node} reports partition-id {report.home}, not one of {self.num_homes}")
            if report.home in self.node_of:
                raise RuntimeError(f"nodes {self.node_of[report.home]} and {node} both are home {report.home}")
            self.node_of[report.home] = node
            self._profiled[report.home] = report
            reports.append(report)
        log.info("connected %d of %d homes", len(self.node_of), self.num_homes)
        return reports

    def query(self, homes: Sequence[int], virtual_time: float) -> list[HomeReport]:
        """Profile ``homes`` at ``virtual_time``; errors and silence leave a home out.

        At virtual time 0 the reports :meth:`connect` received are the answer
        (a home's latency is a function of the virtual time and its label
        histogram does not change), which spares the event loop's first
        profiling round.
        """
        if virtual_time == 0.0 and all(home in self._profiled for home in homes):
            return [self._profiled[home] for home in homes]
        messages = {
            home: Message(protocol.query_content(self.setup_json, virtual_time, self.train_config), self.node_of[home], MessageType.QUERY)
            for home in homes
            if home in self.node_of
        }
        reports = []
        for home, reply in self._exchange(messages, self.query_timeout_s).items():
            if reply.has_error():
                log.warning("home %d could not be profiled: %s", home, reply.error.reason)
                continue
            reports.append(protocol.read_report(reply))
        return reports

    def train(self, tasks: Sequence[TrainTask]) -> list[TrainReply]:
        """Send every task at once; replies in arrival order, homes silent past the reply timeout left out."""
        messages = self._train_messages(tasks)
        replies = self._exchange({task.home: m for task, m in messages}, self.reply_timeout_s)
        return [protocol.read_reply(reply, home) for home, reply in replies.items()]

    def submit(self, tasks: Sequence[TrainTask]) -> None:
        """Push every task and return; :meth:`collect` brings the replies (an error for a task not delivered)."""
        messages = self._train_messages(tasks)
        pushed = set(self.grid.push_messages([m for _, m in messages]))
        now = time.monotonic()
        delivered = set()
        for task, message in messages:
            if message.metadata.message_id in pushed:
                self._submitted[message.metadata.message_id] = (task, now)
                delivered.add(id(task))
        self._undelivered += [
            (task, TrainReply(task.home, None, 0, math.nan, math.nan, error="not delivered: home not connected"))
            for task in tasks if id(task) not in delivered
        ]

    def collect(self, wait_s: float | None) -> list[tuple[TrainTask, TrainReply]]:
        """Replies of submitted tasks that arrived, waiting up to ``wait_s`` (None: ``reply_timeout_s``) for one.

        A task unanswered ``reply_timeout_s`` after it was pushed comes back
        once as an error reply, so a caller waiting on it never waits forever.
        """
        deadline = time.monotonic() + (self.reply_timeout_s if wait_s is None else wait_s)
        if self._undelivered:
            out, self._undelivered = self._undelivered, []
            return out
        while self._submitted:
            out = []
            for reply in self.grid.pull_messages(list(self._submitted)):
                entry = self._submitted.pop(reply.metadata.reply_to_message_id, None)
                if entry is not None:
                    out.append((entry[0], protocol.read_reply(reply, entry[0].home)))
            now = time.monotonic()
            for message_id, (task, pushed_at) in list(self._submitted.items()):
                if now - pushed_at > self.reply_timeout_s:
                    del self._submitted[message_id]
                    out.append((task, TrainReply(task.home, None, 0, math.nan, math.nan,
                                                 error=f"no reply within {self.reply_timeout_s:g} s")))
            if out or now >= deadline:
                return out
            self._sleep(self.poll_interval_s)
        return []

    def _train_messages(self, tasks: Sequence[TrainTask]) -> list[tuple[TrainTask, Message]]:
        messages = []
        for task in tasks:
            if task.home not in self.node_of:
                log.warning("home %d is not connected; its task is dropped", task.home)
                continue
            content = protocol.train_content(task.weights, task.train, task.route.virtual_time, self.setup_json)
            message = Message(content, self.node_of[task.home], MessageType.TRAIN, group_id=str(task.route.round))
            messages.append((task, message))
        return messages

    def _exchange(self, messages: dict[int, Message], timeout_s: float) -> dict[int, Message]:
        """Push ``messages`` (keyed by home or node) and pull replies until all are in or ``timeout_s``."""
        if not messages:
            return {}
        pushed = set(self.grid.push_messages(list(messages.values())))
        pending = {
            message.metadata.message_id: key
            for key, message in messages.items()
            if message.metadata.message_id in pushed
        }
        replies: dict[int, Message] = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            for reply in self.grid.pull_messages(list(pending)):
                key = pending.pop(reply.metadata.reply_to_message_id, None)
                if key is not None:
                    replies[key] = reply
            if not pending or time.monotonic() > deadline:
                break
            self._sleep(self.poll_interval_s)
        if pending:
            log.info("%d of %d homes did not answer within %.1f s", len(pending), len(messages), timeout_s)
        return replies

    def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or raise :class:`RunStopped` as soon as ``stop`` is set."""
        if self.stop.wait(seconds):
            raise RunStopped("stopped while waiting for homes")
