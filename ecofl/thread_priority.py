"""Safety's work at the CPU's lowest priority: it runs while the stage waits, not while it computes.

A device's fault tolerance (Asteroid §3.4's replicas, the global copy)
travels while its stage computes (:mod:`ecofl.pipeline.runtime.replica`), but
on a device confined to a CPU quota the CPU those copies take (sealing,
copying, opening their bytes) comes out of the quota the stage computes with:
0.02-0.05 CPU-s a sync-round at each stage of Eco-FL's confined testbed, up to
a tenth of a Jetson Nano's compute (docs/pipeline.md, steady runs). Every
stage also waits in a sync-round (hand-offs, the 1F1B warm-up and cool-down),
and a quota unused while it waits is lost. Under Linux's ``SCHED_IDLE``
policy (sched(7)) a thread runs only when no other thread of its cgroup is
ready to, and gives way the moment one wakes: the copies then use the quota
the stage leaves, and the stage's compute and its activations' hand-offs
come first.

A thread may always lower itself; raising a thread back needs
``CAP_SYS_NICE`` (root, as a confined home's portal and workers run).
:class:`SwitchedPriority` is for a link's threads, which carry both the
pipeline's tensors and replica pieces: idle for a piece, normal for an
activation, and raised by whoever posts an activation meanwhile (a piece
half sealed at idle priority while the stage computes must not hold the
activation back). Where raising is not allowed it leaves the thread as it is.

Only where a device's threads share a CPU budget of their own (a cgroup of
its own, a real device) does idle priority mean "while the stage waits"; on
a shared host it would mean "while nothing else on the host runs", so
:func:`background_at_idle` reads it from the worker's environment
(:data:`BACKGROUND_ENV`, which :class:`~ecofl.pipeline.runtime.confinement.Confinement`
sets).
"""

from __future__ import annotations

import functools
import os
import threading

#: A worker's background work at idle priority ("idle") or at its own ("normal", the default).
BACKGROUND_ENV = "ECOFL_BACKGROUND_PRIORITY"
BACKGROUND_CHOICES = ("idle", "normal")
_IDLE = getattr(os, "SCHED_IDLE", None)  # Linux only
_OTHER = getattr(os, "SCHED_OTHER", None)


def background_at_idle() -> bool:
    """Whether this worker runs its background work at idle priority (:data:`BACKGROUND_ENV`, Linux only)."""
    value = os.environ.get(BACKGROUND_ENV, "normal")
    if value not in BACKGROUND_CHOICES:
        raise ValueError(f"{BACKGROUND_ENV}={value!r}: expected one of {', '.join(BACKGROUND_CHOICES)}")
    return value == "idle" and _IDLE is not None


def policy_of(thread_id: int) -> int:
    """The scheduling policy of the thread with native id ``thread_id`` (``os.SCHED_*``)."""
    return os.sched_getscheduler(thread_id)


def lower_this_thread() -> None:
    """Run the calling thread at idle priority from now on (a thread may always lower itself)."""
    os.sched_setscheduler(0, _IDLE, os.sched_param(0))


@functools.cache
def can_raise() -> bool:
    """Whether this process may raise one of its threads back from idle priority (``CAP_SYS_NICE``): tried on
    a thread of its own that ends at once."""
    if _IDLE is None:
        return False
    allowed = []

    def probe() -> None:
        lower_this_thread()
        try:
            os.sched_setscheduler(0, _OTHER, os.sched_param(0))
            allowed.append(True)
        except PermissionError:
            allowed.append(False)

    thread = threading.Thread(target=probe, name="priority-probe")
    thread.start()
    thread.join()
    return allowed[0]


class SwitchedPriority:
    """The priority of one thread that does background and foreground work by turns.

    The thread says what it starts (:meth:`background`, :meth:`foreground`);
    any other thread that gives it foreground work calls :meth:`urgent`, which
    raises it at once (it may be half-way through a background piece) and keeps
    it from lowering itself until it has started that work. Inactive (every
    call does nothing) unless ``active`` and :func:`can_raise`.
    """

    def __init__(self, active: bool):
        self.active = active and can_raise()
        self._lock = threading.Lock()
        self._lowered: int | None = None  # the native id of the thread while it is lowered
        self._urgent = False

    def background(self) -> None:
        """The calling thread starts background work: idle priority, unless foreground work waits for it."""
        with self._lock:
            if self.active and self._lowered is None and not self._urgent:
                lower_this_thread()
                self._lowered = threading.get_native_id()

    def foreground(self) -> None:
        """The calling thread starts foreground work: its normal priority."""
        with self._lock:
            self._urgent = False
            self._raise()

    def urgent(self) -> None:
        """Foreground work was given to the thread: raise it now, and until it starts that work."""
        with self._lock:
            self._urgent = self.active
            self._raise()

    def _raise(self) -> None:
        if self._lowered is not None:
            try:
                os.sched_setscheduler(self._lowered, _OTHER, os.sched_param(0))
            except ProcessLookupError:  # the thread has ended (its link closed)
                pass
            self._lowered = None
