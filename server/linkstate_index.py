"""Flower's in-memory LinkState, with its undelivered messages indexed by destination node.

Flower's simulation engine (flwr 1.41, ``flwr.server.superlink.fleet.vce``)
asks its in-memory LinkState, every 0.1 s and for *every* simulated node, for
that node's next undelivered message (``get_message_ins(node_id, limit=1)``),
and that call scans every message the state holds. With N nodes and M
messages in the state one sweep costs O(N x M): at 30,000 homes, a connect
query of 30,000 messages made each sweep ~10^9 message checks, the engine
thread stopped feeding the Ray actors, and the run hung (issue 15;
``docs/scale.md`` has the profile). The state is built inside
``run_simulation`` (and inside ``flwr run``'s simulation process), so there
is no way to hand the engine another one.

:func:`index_messages_by_node` therefore wraps two methods of
``InMemoryLinkState``, in the process that runs the ServerApp (which is the
process that runs the engine in both cases):

* ``store_message_ins`` also files each stored message id under its
  destination node;
* ``get_message_ins(node_id, ...)`` looks only at that node's ids, in the
  order they were stored, applies Flower's own per-message checks
  (``_check_stored_messages``: expiry, federation) and marks what it returns
  as delivered, as the original does. Ids whose message left the state
  (replied and pulled, expired, deleted by ``stop_run``) are dropped from the
  index when met.

The answer is the original's for every call in which the engine uses it
(``tests/test_linkstate_index.py`` compares both on the same states).

That makes a sweep O(N) calls that find nothing, still 100,000 lock-and-look
calls every 0.1 s at 100,000 homes, which kept one core of the driver busy
and starved the threads that feed the actors (measured in docs/scale.md).
So the engine's sweep, ``vce_api.add_messages_to_queue``, is replaced by
:func:`sweep_nodes_with_messages`: the same loop (every 0.1 s, at most one
message per node per sweep, into the same queue) over only the nodes the
index has undelivered messages for, oldest first. Nothing else of Flower
changes, and a SuperLink of a deployment (its own process, perhaps
SQL-backed) is not touched.

The patch is made only on the Flower it was written against: the sources
of every Flower function it wraps, replaces or calls are fingerprinted
(:func:`flower_internals`) and compared with the fingerprints of the
releases it was tested with (:data:`KNOWN_FLOWER_INTERNALS`). On any other
Flower it patches nothing, says so in one line, and the simulation runs on
Flower's own code (correct, only slow beyond some 10,000 homes).

Install it before ``run_simulation`` starts the engine
(:func:`simulations.run.simulate` does; with ``flwr run`` the ServerApp
installs it when it starts, which is seconds before the engine's Ray is up;
an engine that started first keeps Flower's sweep, which is correct, only
slow).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import threading
from functools import wraps

from queue import Queue

from flwr.app import Message
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.supercore.date import now
from flwr import __version__ as FLOWER_VERSION

#: The per-state index: node id -> ids of messages stored for it (a dict used as an ordered set).
INDEX_ATTRIBUTE = "_ecofl_messages_by_node"

#: Flower's own method, kept for comparison (tests/test_linkstate_index.py).
FLOWER_GET_MESSAGE_INS = InMemoryLinkState.get_message_ins

#: Flower's internals this module wraps, replaces or relies on, as Flower defines them (taken at import).
FLOWER_INTERNALS = {
    "InMemoryLinkState.__init__": InMemoryLinkState.__init__,
    "InMemoryLinkState.store_message_ins": InMemoryLinkState.store_message_ins,
    "InMemoryLinkState.get_message_ins": InMemoryLinkState.get_message_ins,
    "InMemoryLinkState._check_stored_messages": InMemoryLinkState._check_stored_messages,
    "vce_api.add_messages_to_queue": vce_api.add_messages_to_queue,
}
#: The fingerprint of :data:`FLOWER_INTERNALS` in each Flower release the index was tested with.
KNOWN_FLOWER_INTERNALS = {
    "1.42.0": "2c77d137b9ed1eecf88b0a18424f5c79e325cad2885793b4266cc1893cafc5b1",
}

_installed = threading.Lock()
_log = logging.getLogger(__name__)


def flower_internals() -> str:
    """A fingerprint (sha256) of the sources of the Flower internals the index depends on."""
    digest = hashlib.sha256()
    for name, function in sorted(FLOWER_INTERNALS.items()):
        digest.update(name.encode() + b"\0" + inspect.getsource(function).encode() + b"\0")
    return digest.hexdigest()


def index_messages_by_node() -> bool:
    """Install the index on ``InMemoryLinkState`` (idempotent, thread-safe); False, with one line logged,
    where Flower's internals are not those it was written against (Flower's own code then runs)."""
    with _installed:
        if getattr(InMemoryLinkState, "_ecofl_indexed", False):
            return True
        if flower_internals() not in KNOWN_FLOWER_INTERNALS.values():
            if getattr(InMemoryLinkState, "_ecofl_refused", False):
                return False  # said once already
            InMemoryLinkState._ecofl_refused = True
            _log.warning("Flower %s's in-memory LinkState is not the one server/linkstate_index.py was written "
                         "against (%s): Flower's own message sweep runs, correct but slow beyond ~10,000 homes",
                         FLOWER_VERSION, ", ".join(KNOWN_FLOWER_INTERNALS))
            return False
        InMemoryLinkState.store_message_ins = _indexed_store(InMemoryLinkState.store_message_ins)
        InMemoryLinkState.get_message_ins = _indexed_get
        InMemoryLinkState._ecofl_indexed = True
        vce_api.add_messages_to_queue = sweep_nodes_with_messages
        return True


def _index(state: InMemoryLinkState) -> dict[int, dict[str, None]]:
    index = state.__dict__.get(INDEX_ATTRIBUTE)
    if index is None:
        index = state.__dict__.setdefault(INDEX_ATTRIBUTE, {})
    return index


def _indexed_store(store):
    @wraps(store)
    def store_message_ins(self: InMemoryLinkState, message: Message) -> str | None:
        with self.lock:
            message_id = store(self, message)
            if message_id is not None:
                _index(self).setdefault(message.metadata.dst_node_id, {})[message_id] = None
        return message_id

    return store_message_ins


def _indexed_get(
    self: InMemoryLinkState, node_id: int, limit: int | None, *, run_id: int | None = None
) -> list[Message]:
    """Undelivered messages for ``node_id`` (at most ``limit``), oldest first; marked delivered."""
    if limit is not None and limit < 1:
        raise AssertionError("`limit` must be >= 1")
    found: list[Message] = []
    with self.lock:
        index = _index(self)
        pending = index.get(node_id)
        if not pending:
            return found
        for message_id in list(pending):
            self._check_stored_messages({message_id})
            message = self.message_ins_store.get(message_id)
            if message is None or message.metadata.delivered_at != "":
                del pending[message_id]  # gone from the state, or delivered: never returned again
                continue
            if run_id is not None and message.metadata.run_id != run_id:
                continue
            found.append(message)
            del pending[message_id]
            if limit and len(found) == limit:
                break
        if not pending:
            del index[node_id]
    delivered_at = now().isoformat()
    for message in found:
        message.metadata.delivered_at = delivered_at
    return found


def sweep_nodes_with_messages(
    state: InMemoryLinkState, queue: Queue, nodes_mapping: dict[int, int], f_stop: threading.Event
) -> None:
    """The simulation engine's message sweep over the nodes with undelivered messages only.

    Flower's ``add_messages_to_queue`` asks every node of ``nodes_mapping`` for one message every 0.1 s;
    this asks only the nodes the index holds messages for (in the order their oldest message was stored).
    """
    while not f_stop.is_set():
        with state.lock:
            nodes = [node for node in _index(state) if node in nodes_mapping]
        for node_id in nodes:
            for message in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(message)
        f_stop.wait(0.1)
