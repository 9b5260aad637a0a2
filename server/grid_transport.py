"""The event loop's :class:`~ecofl.fl.transport.Transport` over a Flower ``Grid``.

Homes are named by partition id in the event loop and by node id in Flower;
node ids are random per run, so :meth:`GridTransport.connect` first waits
for the nodes, sends every node a query and keeps the partition-id -> node-id
map from the replies. After that ``query`` and ``train`` push one message
per home, poll ``pull_messages`` until every reply is in or the deadline
passes, and return the replies in whatever order they came; a home that did
not answer in time is simply missing (a straggler), and a home that answered
with an error comes back as ``TrainReply.error``. ``submit`` queues, pushes
and returns; ``collect`` polls for whatever has arrived since (the wall
clock's arrival order; on the virtual clock the loop submits too, so the
rounds in flight train side by side: ``ecofl.fl.foreseen_rounds``).

**Dispatch batches.** With ``batch_homes``, every training message of a
``train`` call, or of a ``submit`` of one dispatch (``batched``), names the
homes and seeds it may train with
(:func:`ecofl.fl.dispatch_batch.dispatch_batches`): whichever process gets
the first of them trains the batch as one computation
(``client/dispatch_batches.py``). Only the virtual clock sends batches: on
the wall clock a home's training time is its latency.

**Scale** (``docs/scale.md``). Every exchange, and the submitted tasks, keep
at most ``window`` messages in flight and push the next ones as replies come in, so what the
server polls, and what Flower's state holds, does not grow with the number
of homes; a poll that took t seconds is followed by a pause of at least
``POLL_PAUSE_FACTOR`` x t, so polling never takes more than a fraction of
the process (the simulation engine's threads share it). Each message lives
only until its exchange's deadline (its TTL): a query left unanswered when
the connect phase gives up expires in Flower's state instead of queueing in
front of the first training round. The connect phase logs its progress.

**Silent homes.** When not every home has connected and answered the
connect query within ``connect_timeout_s``, ``silent_homes`` decides:
``"continue"`` goes on with the homes that answered (logged, and counted in
``summary.json``), ``"stop"`` raises :class:`HomesSilent` naming how many
were missing.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import TypeVar

from flwr.app import Message, MessageType
from flwr.serverapp import Grid

import protocol
from ecofl.errors import UserError
from ecofl.fl.dispatch_batch import DispatchBatch, dispatch_batches
from ecofl.fl.home_failures import HomeFailures
from ecofl.fl.transport import HomeReport, RunStopped, TrainReply, TrainTask
from server.config import SILENT_HOMES
from server.submitted_tasks import SubmittedTasks
from server.transport_times import TransportTimes

log = logging.getLogger(__name__)

Key = TypeVar("Key")

#: After a poll that took t seconds, wait at least this many times t before the next.
POLL_PAUSE_FACTOR = 4.0
#: Seconds between two progress lines of the connect phase.
PROGRESS_EVERY_S = 10.0


class HomesSilent(UserError):
    """Homes did not connect or answer in time and the run is configured to stop then."""


class GridTransport:
    """Reach homes through ``grid``; ``setup_json`` (a :class:`ecofl.fl.federation_setup.FederationSetup`) goes
    with every message.

    A query waits at most ``query_timeout_s`` for its replies, a training
    task ``reply_timeout_s``. At most ``window`` messages of one exchange are
    in flight at a time. Setting ``stop`` (Ctrl-C) ends any wait with
    :class:`~ecofl.fl.transport.RunStopped` within ``poll_interval_s``.
    ``batch_homes``: ``train`` (and a ``batched`` ``submit``) names each task's dispatch batch (module docstring).
    ``train_in_background``: the transport's ``trains_in_background`` (``ecofl.fl.foreseen_rounds``).
    ``failures``: where the failures only the transport sees are counted by kind: the connect phase's, the
    queries', and training tasks that never answered (the loop counts those that answered with an error).
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
        window: int = 500,
        silent_homes: str = "continue",
        train_config: dict | None = None,
        stop: threading.Event | None = None,
        batch_homes: bool = False,
        failures: HomeFailures | None = None,
        train_in_background: bool = True,
    ) -> None:
        if silent_homes not in SILENT_HOMES:
            raise UserError(f"silent_homes must be one of {', '.join(SILENT_HOMES)}, got {silent_homes!r}")
        if window < 1:
            raise UserError(f"the window of messages in flight must be at least 1, got {window}")
        self.grid = grid
        self.setup_json = setup_json
        self.num_homes = num_homes
        self.query_timeout_s = query_timeout_s
        self.reply_timeout_s = reply_timeout_s
        self.poll_interval_s = poll_interval_s
        self.window = window
        self.silent_homes = silent_homes
        self.stop = stop or threading.Event()
        self.train_config = dict(train_config or {})  # sent with queries: homes without a latency model probe
        self.batch_homes = batch_homes
        self.failures = failures or HomeFailures()  # connect and query failures (the loop counts the training's)
        self._run_token = uuid.uuid4().hex[:12]  # batch ids are unique within the run (and across runs)
        self.node_of: dict[int, int] = {}  # partition id -> node id
        self.times = TransportTimes()
        self._profiled: dict[int, HomeReport] = {}  # what connect learned at virtual time 0
        self._tasks = SubmittedTasks(window, reply_timeout_s)  # what submit sent and collect has not handed back
        # the virtual clock's loop submits and collects (the homes train meanwhile) instead of calling train
        self.trains_in_background = train_in_background

    def connect(self, timeout_s: float = 300.0) -> list[HomeReport]:
        """Wait for ``num_homes`` nodes, query them all and map partition ids to node ids.

        Returns the reports (at virtual time 0). Homes that do not connect or
        answer within ``timeout_s`` are left out, or raise :class:`HomesSilent`
        when ``silent_homes`` is ``"stop"``; no answer at all always raises it.
        Raises ``RuntimeError`` when two nodes claim one partition id or a node
        reports a partition id outside the federation.
        """
        started = time.monotonic()
        deadline = started + timeout_s
        node_ids = sorted(self.grid.get_node_ids())
        while len(node_ids) < self.num_homes and time.monotonic() < deadline:
            self._sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            node_ids = sorted(self.grid.get_node_ids())
        log.info("connect: %d of %d homes connected; querying them, %d at a time",
                 len(node_ids), self.num_homes, self.window)
        deadline = max(deadline, time.monotonic() + 1.0)  # the nodes that came get their query, even when late

        def query(node: int) -> Message:
            content = protocol.query_content(self.setup_json, 0.0, self.train_config)
            return Message(content, node, MessageType.QUERY, ttl=_ttl(deadline))

        replies = self._exchange(node_ids, query, deadline, "connect")
        reports = []
        for node in sorted(set(node_ids) - set(replies)):
            self.failures.record("connect:silent", f"node {node}", f"no answer to the connect query in {timeout_s:g} s")
        for node, reply in replies.items():
            if reply.has_error():
                self.failures.record(f"connect:{protocol.failure_kind(reply)}", f"node {node}", reply.error.reason)
                continue
            report = protocol.read_report(reply)
            if not 0 <= report.home < self.num_homes:
                raise RuntimeError(f"node {node} reports partition-id {report.home}, not one of {self.num_homes}")
            if report.home in self.node_of:
                raise RuntimeError(f"nodes {self.node_of[report.home]} and {node} both are home {report.home}")
            self.node_of[report.home] = node
            self._profiled[report.home] = report
            reports.append(report)
        self.times.connect_s = time.monotonic() - started
        self.times.homes_connected = len(self.node_of)
        self._check_silent(len(node_ids), timeout_s)
        log.info("connected %d of %d homes in %.1f s", len(self.node_of), self.num_homes, self.times.connect_s)
        return reports

    def _check_silent(self, connected: int, timeout_s: float) -> None:
        """Apply the ``silent_homes`` rule after the connect phase."""
        silent = self.num_homes - len(self.node_of)
        if not silent:
            return
        what = (f"{silent} of {self.num_homes} homes did not answer the connect query within {timeout_s:g} s "
                f"(only {connected} of {self.num_homes} homes connected, {len(self.node_of)} answered)")
        if not self.node_of:
            raise HomesSilent(f"{what}; nothing to train")
        if self.silent_homes == "stop":
            raise HomesSilent(f"{what}; to go on with the homes that answered set server.silent_homes=continue, "
                              "or give them longer with server.connect_timeout_s")
        log.warning("%s; going on with the %d homes that answered", what, len(self.node_of))

    def query(self, homes: Sequence[int], virtual_time: float) -> list[HomeReport]:
        """Profile ``homes`` at ``virtual_time``; errors and silence leave a home out.

        At virtual time 0 the reports :meth:`connect` received are the answer
        (a home's latency is a function of the virtual time and its label
        histogram does not change), which spares the event loop's first
        profiling round; homes that did not answer the connect query stay out.
        """
        if virtual_time == 0.0:
            return [self._profiled[home] for home in homes if home in self._profiled]
        started = time.monotonic()
        deadline = started + self.query_timeout_s

        def query(home: int) -> Message:
            content = protocol.query_content(self.setup_json, virtual_time, self.train_config)
            return Message(content, self.node_of[home], MessageType.QUERY, ttl=_ttl(deadline))

        known = [home for home in homes if home in self.node_of]
        reports = []
        replies = self._exchange(known, query, deadline)
        for home in sorted(set(known) - set(replies)):
            self.failures.record("query:silent", f"home {home}", f"no answer within {self.query_timeout_s:g} s")
        for home, reply in replies.items():
            if reply.has_error():
                self.failures.record(f"query:{protocol.failure_kind(reply)}", f"home {home}", reply.error.reason)
                continue
            reports.append(protocol.read_report(reply))
        self.times.query_s += time.monotonic() - started
        self.times.queries += 1
        return reports

    def train(self, tasks: Sequence[TrainTask]) -> list[TrainReply]:
        """Send every task at once; replies in arrival order, homes silent past the reply timeout left out."""
        started = time.monotonic()
        if self.times.first_train_at is None:
            self.times.first_train_at = started
        deadline = started + self.reply_timeout_s
        batches = dispatch_batches(tasks, f"{self._run_token}.{self.times.train_calls}") if self.batch_homes else {}
        messages = {task.home: message
                    for task, message in self._train_messages(tasks, ttl=self.reply_timeout_s, batches=batches)}
        replies = self._exchange(list(messages), messages.__getitem__, deadline)
        self.times.train_calls += 1
        self.times.train_wall_s += time.monotonic() - started
        for home in sorted(set(messages) - set(replies)):
            self.failures.record("train:silent", f"home {home}", f"no reply within {self.reply_timeout_s:g} s")
        out = []
        for home, reply in replies.items():
            self._note_worker(reply)
            out.append(protocol.read_reply(reply, home))
        return out

    def submit(self, tasks: Sequence[TrainTask], batched: bool = False) -> None:
        """Queue every task, push what the window has room for and return; :meth:`collect` pushes the rest as
        replies come in and brings the replies (an error for a task not delivered).

        ``batched`` (one dispatch's tasks) names their dispatch batches as :meth:`train` does, with ``batch_homes``.
        """
        started = time.monotonic()
        if self.times.first_train_at is None:
            self.times.first_train_at = started
        batches = {}
        if batched and self.batch_homes:
            batches = dispatch_batches(tasks, f"{self._run_token}.{self.times.train_calls}")
        self.times.train_calls += 1
        self._tasks.queue(tasks, batches)
        self._push_queued()
        self.times.train_wall_s += time.monotonic() - started

    def _push_queued(self) -> None:
        """Push the queued tasks the window has room for (``server.submitted_tasks``)."""
        chunk = self._tasks.next_to_push()
        if not chunk:
            return
        tasks = [task for task, _ in chunk]
        batches = {task.home: batch for task, batch in chunk if batch is not None}
        messages = self._train_messages(tasks, ttl=self.reply_timeout_s, batches=batches)
        pushed = set(self.grid.push_messages([m for _, m in messages]))
        self._tasks.record_push(tasks, messages, pushed, time.monotonic())

    def collect(self, wait_s: float | None) -> list[tuple[TrainTask, TrainReply]]:
        """Replies of submitted tasks that arrived, waiting up to ``wait_s`` (None: ``reply_timeout_s``) for one.

        A task unanswered ``reply_timeout_s`` after it was pushed comes back
        once as an error reply, so a caller waiting on it never waits forever.
        """
        started = time.monotonic()
        try:
            return self._collect(started + (self.reply_timeout_s if wait_s is None else wait_s))
        finally:
            self.times.train_wall_s += time.monotonic() - started

    def _collect(self, deadline: float) -> list[tuple[TrainTask, TrainReply]]:
        while self._tasks:
            self._push_queued()
            out = self._tasks.take_undelivered()
            if out:
                return out
            polled = time.perf_counter()
            for reply in self.grid.pull_messages(list(self._tasks.pushed)):
                task = self._tasks.answered(reply.metadata.reply_to_message_id)
                if task is not None:
                    self._note_worker(reply)
                    out.append((task, protocol.read_reply(reply, task.home)))
            polled = time.perf_counter() - polled
            now = time.monotonic()
            out += self._tasks.timed_out(now)
            if out or now >= deadline:
                return out
            self._sleep(max(self.poll_interval_s, POLL_PAUSE_FACTOR * polled))
        return []

    def _train_messages(
        self, tasks: Sequence[TrainTask], ttl: float, batches: dict[int, DispatchBatch] | None = None
    ) -> list[tuple[TrainTask, Message]]:
        messages = []
        for task in tasks:
            if task.home not in self.node_of:
                log.warning("home %d is not connected; its task is dropped", task.home)
                continue
            batch = (batches or {}).get(task.home)
            content = protocol.train_content(task.weights, task.train, task.route.virtual_time, self.setup_json, batch)
            message = Message(content, self.node_of[task.home], MessageType.TRAIN, ttl=max(ttl, 1.0),
                              group_id=str(task.route.round))
            messages.append((task, message))
        return messages

    def _note_worker(self, reply: Message) -> None:
        """Count a train reply by the worker node that ran it, and add up the training time it measured."""
        if reply.has_error():
            return
        self.times.train_replies += 1
        worker = protocol.read_worker(reply)
        self.times.replies_by_node[worker.node] += 1
        self.times.replies_by_device[worker.device] += 1
        self.times.batched_replies += worker.batched
        self.times.home_train_s += worker.train_s

    def _exchange(
        self, keys: Sequence[Key], make: Callable[[Key], Message], deadline: float, progress: str | None = None
    ) -> dict[Key, Message]:
        """Push the message ``make(key)`` of every key (a home or a node), at most ``window`` in flight, and
        pull replies until all are in or ``deadline`` (``time.monotonic()``) passes; the replies by key.

        Messages are made when they are pushed (their TTL runs from then);
        with ``progress`` a log line reports how many answered every
        :data:`PROGRESS_EVERY_S` seconds.
        """
        total = len(keys)
        waiting: Iterator[Key] = iter(keys)
        pending: dict[str, Key] = {}
        replies: dict[Key, Message] = {}
        sent = 0
        started = last_report = time.monotonic()
        while True:
            room = self.window - len(pending)
            if room > 0 and sent < total and time.monotonic() < deadline:
                batch = [(key, make(key)) for key in islice(waiting, room)]
                sent += len(batch)
                pushed = set(self.grid.push_messages([m for _, m in batch]))
                pending.update((m.metadata.message_id, key) for key, m in batch if m.metadata.message_id in pushed)
            polled = time.perf_counter()
            if pending:
                for reply in self.grid.pull_messages(list(pending)):
                    key = pending.pop(reply.metadata.reply_to_message_id, None)
                    if key is not None:
                        replies[key] = reply
            polled = time.perf_counter() - polled
            now = time.monotonic()
            if progress and now - last_report >= PROGRESS_EVERY_S:
                last_report = now
                log.info("%s: %s", progress, _progress_line(len(replies), total, len(pending), now - started))
            if (not pending and sent >= total) or now >= deadline:
                break
            self._sleep(max(self.poll_interval_s, POLL_PAUSE_FACTOR * polled))
        if len(replies) < total:
            log.info("%d of %d homes did not answer within %.1f s (%d were never sent)",
                     total - len(replies), total, time.monotonic() - started, total - sent)
        return replies

    def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or raise :class:`RunStopped` as soon as ``stop`` is set."""
        if self.stop.wait(seconds):
            raise RunStopped("stopped while waiting for homes")


def _progress_line(answered: int, total: int, in_flight: int, waited_s: float) -> str:
    """What an exchange is waiting for: the first answers (the homes' processes starting), or the rest."""
    if not answered:
        return (f"waiting {waited_s:.0f} s for the first of {total} homes to answer ({in_flight} asked; the "
                "simulation engine starts its actors and each loads the dataset once)")
    rate = answered / waited_s
    return (f"{answered} of {total} homes answered ({rate:.0f}/s, about {(total - answered) / rate:.0f} s left), "
            f"{in_flight} in flight")


def _ttl(deadline: float) -> float:
    """A message's time to live: until ``deadline`` (``time.monotonic()``), at least a second."""
    return max(deadline - time.monotonic(), 1.0)

