"""Where a Flower transport's wall time went and what the homes reported of their training (``timing.json``),
and where the homes trained (``summary.json``'s ``device`` and ``batch_homes``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class TransportTimes:
    """Where the transport's wall time went, and what the homes reported (``timing.json``).

    ``train_calls`` counts the dispatches sent (``train`` and ``submit``
    calls); ``train_wall_s`` is the time spent in them and in ``collect``
    (push, waiting for the homes' training, transport, pull); ``home_train_s`` sums the
    training seconds the homes measured themselves; ``replies_by_node``
    counts train replies per worker node (the Ray node of the actor that ran
    the home, or the host name of a deployed home).
    """

    connect_s: float = 0.0
    homes_connected: int = 0
    query_s: float = 0.0
    queries: int = 0
    train_calls: int = 0
    train_wall_s: float = 0.0
    train_replies: int = 0
    home_train_s: float = 0.0
    first_train_at: float | None = None  # time.monotonic() when the first training round was pushed
    replies_by_node: Counter = field(default_factory=Counter)
    replies_by_device: Counter = field(default_factory=Counter)  # what the homes trained on ("cpu", "cuda:0 ...")
    batched_replies: int = 0  # homes trained together with their dispatch batch

    def to_json(self) -> dict:
        """The times and counts (not ``first_train_at``, a clock reading meaningless outside this process)."""
        data = asdict(self)
        del data["first_train_at"]
        data["replies_by_node"] = dict(self.replies_by_node)
        data["replies_by_device"] = dict(self.replies_by_device)
        return data

    def placement(self) -> dict:
        """``summary.json``'s ``device`` (what the homes trained on; several joined by ", ") and ``batch_homes``
        (whether homes were trained with their dispatch batches); None before any home trained."""
        devices = sorted(self.replies_by_device)
        return {"device": ", ".join(devices) if devices else None, "batch_homes": self.batched_replies > 0}
