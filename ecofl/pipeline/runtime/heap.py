"""A long-lived process's objects kept out of the garbage collector's full passes.

Python's cyclic collector now and then walks every object it tracks (a full,
generation-2 collection) and holds the GIL while it does. After importing
torch and building MobileNetV2 a worker tracks about 340,000 objects, and a
full pass takes about 170 ms of a host core: 2.6 s on a device confined to
0.066 cores. Its heartbeat thread needs the GIL to beat, so the device went
silent past the portal's 2 s detection bound and a live device was declared
lost (Asteroid's Env D under ``--emulate cgroup``: each kill of one device
took one or two live Nanos with it, docs/adapt_cgroup.md). A real board's
CPU pauses the same way, if less.

Those objects (modules, the model) live as long as the process, so
:func:`freeze_heap` moves them to the collector's permanent generation
(:func:`gc.freeze`): later passes walk only what the process allocated
since. The fork server freezes before it forks, so its children's passes
never touch the pages they share with it (Python's advice for ``fork``
without ``exec``); a worker freezes again once its model is built.
"""

from __future__ import annotations

import gc


def freeze_heap() -> int:
    """Collect what is garbage now, then keep every object left out of later passes; how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
