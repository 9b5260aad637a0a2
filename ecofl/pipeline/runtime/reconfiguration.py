"""Entering a new pipeline epoch from a committed version: roll back, migrate the layers, take the new roles.

The second half of every re-plan (Asteroid §3.4's lightweight rescheduling
and its heavy baseline; FTPipeHD Algorithm 1's weight redistribution): after
a failure (:mod:`.recovery` chose the version and who holds each layer at
it, :func:`ecofl.pipeline.migration.restore_point`), a slow-down or a join.
Each worker rolls back to its own committed copies of that version, receives
the layers it lacks from a holder or from the portal's global copy, enters
the epoch's links and answers ``reconfigured`` (:mod:`.worker_requests`).
:func:`restored_from` says, for the record, where a lost device's layers
came from.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ecofl.pipeline.migration import GLOBAL_COPY, Holders, layer_owners, moves_from_holders
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.runtime.control_messages import GetState, Reconfigure, Reconfigured, State
from ecofl.pipeline.runtime.control_plane import ControlPlane
from ecofl.pipeline.runtime.errors import HomePipelineError
from ecofl.pipeline.runtime.faults import Reconfiguration
from ecofl.pipeline.runtime.layout import PipelineLayout
from ecofl.pipeline.runtime.migration_io import pace
from ecofl.pipeline.runtime.stage import Optimization
from ecofl.pipeline.runtime.stage_state import with_momentum_of


def reconfigure(control: ControlPlane, layout: PipelineLayout, new: Plan, version: int, holders: Holders, *,
                epoch: int, global_copy: tuple[int, dict[str, np.ndarray]], reference: dict[str, np.ndarray],
                referenced: dict[int, set[str]], optimization: Optimization, heavy: bool = False,
                recovery: bool = False) -> Reconfiguration:
    """Enter pipeline epoch ``epoch`` running ``new`` from committed ``version``, each layer from its
    ``holders`` (none: ``global_copy``).

    Every device of the epoch (the new plan's first, then the idle ones)
    gets its role, the version to roll back to, the layer moves and, from
    the portal, the layers only the global copy has (``heavy``: every layer,
    gathered at the portal first, Asteroid's heavy rescheduling) and the
    FedProx ``reference`` of the parameters it does not hold yet
    (``referenced``, each device's, kept up to date here: a worker keeps what
    it was sent); the portal's sends are paced to the emulated link rates
    (:meth:`.layout.PipelineLayout.link_rate`). ``recovery`` marks a recovery's epoch (a
    phase point, :mod:`.traps`).
    """
    portal_state: dict[str, np.ndarray] = {}
    moves = []
    moved = 0
    if heavy:
        portal_state, moved = gather_state(control, layout, version, holders, global_copy)
    else:
        moves = [m for m in moves_from_holders(new, holders, layout.profile) if m.layer in holders]
        global_layers = {m.layer for m in moves if m.source == GLOBAL_COPY}
        if global_layers:
            if global_copy[0] != version:
                raise HomePipelineError(f"layers {sorted(global_layers)} have no copy at version {version}")
            portal_state = with_momentum_of(global_copy[1], layout.keys_of_layers(global_layers))
    layout.use_plan(new)
    used = layout.devices
    world = used + sorted(set(control.connections) - set(used))
    rank_of = {d: i for i, d in enumerate(world)}
    role_of = {role.device: role for role in layout.roles}
    ranked = [[m.layer, rank_of[m.source], rank_of[m.target]] for m in moves if m.source != GLOBAL_COPY]
    from_portal: dict[int, set[int]] = {}  # device -> layers only the global copy has
    for m in moves:
        if m.source == GLOBAL_COPY:
            from_portal.setdefault(m.target, set()).add(m.layer)
    for device in world:
        role = role_of.get(device)
        arrays = {}
        if role is not None:
            keys = layout.stage_keys[role.stage] if heavy else layout.keys_of_layers(from_portal.get(device, ()))
            arrays.update(with_momentum_of(portal_state, keys))
            moved += sum(v.nbytes for v in arrays.values())
            held = referenced.setdefault(device, set())
            missing = [k for k in layout.reference_keys(role.stage) if k in reference and k not in held]
            arrays.update({f"reference/{k}": reference[k] for k in missing})
            held.update(missing)
        entry = layout.epoch(epoch, device, world, control.data_ports)
        request = Reconfigure(entry.epoch, entry.role, entry.rank, entry.addresses, restore=version, moves=ranked,
                              optimization=optimization, link_bps=layout.link_rate(device), recovery=recovery)
        pace(sum(a.nbytes for a in arrays.values()), layout.link_rate(0))
        control.send(device, request, arrays)
    replies = control.gather(Reconfigured, world)
    return Reconfiguration(moved + sum(reply.received_bytes for reply in replies.values()),
                           {d: reply.seconds for d, reply in replies.items()},
                           {d: reply.linking_s for d, reply in replies.items()})


def gather_state(control: ControlPlane, layout: PipelineLayout, version: int, holders: Holders,
                 global_copy: tuple[int, dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], int]:
    """Heavy rescheduling's first half: every layer's state at ``version`` to the portal (from its first
    holder; a layer nobody holds, from the global copy); the state and the bytes that came over links."""
    requests: dict[int, list[int]] = {}
    for layer, devices in holders.items():
        if devices:
            requests.setdefault(sorted(devices)[0], []).append(layer)
    for device, layers in requests.items():
        control.send(device, GetState(version, layers, layout.link_rate(device)))
    state: dict[str, np.ndarray] = {}
    for _, arrays in control.gather_with_arrays(State, list(requests)).values():
        state.update({k: np.array(v) for k, v in arrays.items()})
    moved = sum(v.nbytes for v in state.values())
    missing = [layer for layer, devices in holders.items() if not devices]
    if missing:
        state.update(with_momentum_of(global_copy[1], layout.keys_of_layers(missing)))
    return state, moved


def restored_from(plan: Plan, device: int, holders: Holders, version: int, stateful: Sequence[int],
                  new: Plan) -> list[dict]:
    """Where lost ``device``'s layers (of ``plan``) came back from in ``new``: runs of layers with one source
    each (a layer's new owner where it held a copy, else its first holder, as the moves take it)."""
    stage = next((s for s in plan.stages if device in s.devices), None)
    if stage is None:
        return []
    owners = layer_owners(new)
    runs: list[dict] = []
    for layer in range(stage.layers[0], stage.layers[1] + 1):
        if layer not in stateful:
            continue
        devices = sorted(holders.get(layer, ()))
        local = [d for d in owners.get(layer, ()) if d in devices]
        holder = local[0] if local else devices[0] if devices else None
        source = "global copy" if holder is None else "peer" if holder in stage.devices else "backup"
        if runs and runs[-1]["device"] == holder and runs[-1]["source"] == source:
            runs[-1]["layers"][1] = layer
        else:
            runs.append({"layers": [layer, layer], "source": source, "device": holder, "version": version})
    return runs
