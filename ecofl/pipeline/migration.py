"""Which layers move where when a pipeline is re-planned, as plain data (Asteroid §3.4, FTPipeHD Algorithm 1).

After re-planning, a device needs the layers of its new stage that it did
not hold. :func:`moves_from_holders` fetches each one from where it already
is; :func:`restore_point` says, after a failure, from which version and
which holders (the survivors report the committed copies they really hold).
:func:`layer_moves` is the same rule with the holders read off a plan, as
FTPipeHD's weight redistribution (Algorithm 1) and Asteroid's concurrent
layer migration between adjacent stages do: from a surviving device that
held the layer, else from a backup device of the lost device that held it
(:mod:`ecofl.pipeline.replication`), else from the portal's global copy
(:data:`GLOBAL_COPY`). Only layers that change owner move, device to device;
the moves of different devices run concurrently.

:func:`heavy_moves` is the baseline (Asteroid's "heavy rescheduling"):
every layer is gathered at the portal and sent out again to its new owners.

A move carries the layer's weights and optimizer state
(:func:`ecofl.pipeline.replication.stage_state_bytes`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ecofl.devices import HomePool
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.replication import restore_source, stage_state_bytes

#: ``LayerMove.source`` of a layer restored from the portal's global copy.
GLOBAL_COPY = -1
#: The device the portal runs on (Eco-FL §3: device 0 of a home's pool).
PORTAL_DEVICE = 0


@dataclass(frozen=True)
class LayerMove:
    """Layer ``layer``'s weights and optimizer state go from ``source`` to ``target``."""

    layer: int
    source: int  # a device index, or GLOBAL_COPY
    target: int
    nbytes: int


def layer_owners(plan: Plan) -> dict[int, tuple[int, ...]]:
    """``{layer: devices holding it}`` (every device of the layer's stage)."""
    return {layer: stage.devices for stage in plan.stages for layer in range(stage.layers[0], stage.layers[1] + 1)}


#: ``{layer: devices holding a committed copy of it}`` at one version.
Holders = Mapping[int, Collection[int]]
#: ``{device: {version: layers it holds a committed copy of}}``, as the survivors report it.
Holdings = Mapping[int, Mapping[int, Iterable[int]]]


def moves_from_holders(new: Plan, holders: Holders, profile: ModelProfile,
                       owners: Mapping[int, Collection[int]] | None = None) -> list[LayerMove]:
    """The moves that give every device of ``new`` the layers it does not own, from a holder.

    A device that owns a layer already (``owners``, default: its holders)
    keeps it; a device that holds a copy restores it locally (a move with
    ``source == target``); otherwise the layer comes from its first holder,
    or from :data:`GLOBAL_COPY` when nobody holds it.
    """
    owners = holders if owners is None else owners
    moves = []
    for layer, targets in sorted(layer_owners(new).items()):
        held = sorted(holders.get(layer, ()))
        nbytes = stage_state_bytes(profile, (layer, layer))
        for target in targets:
            if target in owners.get(layer, ()):
                continue
            source = target if target in held else held[0] if held else GLOBAL_COPY
            moves.append(LayerMove(layer, source, target, nbytes))
    return moves


def restore_point(holdings: Holdings, layers: Iterable[int], newest: int, global_version: int,
                  ) -> tuple[int, dict[int, list[int]]]:
    """The newest version in [``global_version``, ``newest``] at which every layer of ``layers`` has a surviving
    copy, and who holds each layer then; else ``global_version`` (the portal's global copy fills the gaps).

    In a synchronous pipeline a layer has one state per version, so any
    holder's copy serves: the device's own snapshot, a stage peer's or a
    backup's replica (Asteroid §3.4). Replaying from the version found gives
    the failure-free result; the rounds after it are computed again.
    """
    layers = list(layers)
    held = {d: {int(v): set(ls) for v, ls in by_version.items()} for d, by_version in holdings.items()}

    def holders_at(version: int) -> dict[int, list[int]]:
        return {layer: sorted(d for d, h in held.items() if layer in h.get(version, ())) for layer in layers}

    versions = sorted({v for h in held.values() for v in h if global_version <= v <= newest}, reverse=True)
    for version in versions:
        holders = holders_at(version)
        if all(holders.values()):
            return version, holders
    return global_version, holders_at(global_version)


def layer_moves(
    old: Plan, new: Plan, profile: ModelProfile, lost: Collection[int] = (),
    backups: Mapping[int, Sequence[int]] | None = None,
) -> list[LayerMove]:
    """The moves that give every device of ``new`` the layers it lacks, from the nearest holder.

    A device that holds a layer in ``old`` and is not ``lost`` keeps it. A
    layer all of whose old holders are lost comes from one of their backup
    devices (``backups``: :func:`~ecofl.pipeline.replication.backup_targets`
    of ``old``), or from :data:`GLOBAL_COPY`. A backup device that becomes
    the layer's owner restores it locally (a move with ``source == target``).
    """
    backups = dict(backups or {})
    owners, holders = {}, {}
    for layer, devices in layer_owners(old).items():
        owners[layer] = [d for d in devices if d not in lost]
        live_backups = [b for b in backups.get(devices[0], ()) if b not in lost]
        holders[layer] = owners[layer] or live_backups
    return moves_from_holders(new, holders, profile, owners)


def heavy_moves(
    old: Plan, new: Plan, profile: ModelProfile, lost: Collection[int] = (),
    backups: Mapping[int, Sequence[int]] | None = None,
) -> list[LayerMove]:
    """Heavy rescheduling: every layer to the portal (gather), then to every new owner (redistribute)."""
    lost = set(lost)
    backups = dict(backups or {})
    owners = layer_owners(old)
    moves = []
    for layer in range(old.num_layers):
        holders = [d for d in owners[layer] if d not in lost]
        nbytes = stage_state_bytes(profile, (layer, layer))
        source = _source(old, layer, owners, holders, PORTAL_DEVICE, lost, backups)
        moves.append(LayerMove(layer, source, PORTAL_DEVICE, nbytes))
    for layer, targets in sorted(layer_owners(new).items()):
        nbytes = stage_state_bytes(profile, (layer, layer))
        moves.extend(LayerMove(layer, PORTAL_DEVICE, t, nbytes) for t in targets)
    return moves


def migration_s(new: Plan, holders: Holders, profile: ModelProfile, pool: HomePool) -> float:
    """Seconds the layer moves into ``new`` take: device pairs move in parallel, each its bytes over its link (a
    restore from the portal's global copy over the portal's)."""
    pairs: dict[tuple[int, int], int] = {}
    for move in moves_from_holders(new, holders, profile):
        source = PORTAL_DEVICE if move.source == GLOBAL_COPY else move.source
        if source != move.target:
            pairs[source, move.target] = pairs.get((source, move.target), 0) + move.nbytes
    return max((nbytes / float(pool.bandwidth_bps[pair]) for pair, nbytes in pairs.items()), default=0.0)


def bytes_moved(moves: list[LayerMove]) -> int:
    """Bytes that cross a link (local restores and moves to oneself cost nothing)."""
    return sum(m.nbytes for m in moves if m.source != m.target)


def _source(
    old: Plan, layer: int, owners: Mapping[int, tuple[int, ...]], holders: list[int], target: int,
    lost: set[int], backups: Mapping[int, Sequence[int]],
) -> int:
    """A surviving holder (the target itself if it holds it), else the lost holder's backup, else the global copy."""
    if holders:
        return target if target in holders else holders[0]
    source = restore_source(old, owners[layer][0], lost, backups)
    return GLOBAL_COPY if source is None else source
