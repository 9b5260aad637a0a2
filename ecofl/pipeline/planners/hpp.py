"""Asteroid's hybrid pipeline parallelism planner (Asteroid §3.3, Algorithm 2, eqs. 4-11).

**Structure.** Devices are sorted by memory, largest first (ties: faster
first), and every stage is a *contiguous* group of that order replicated
data-parallel over the stage's layers; stage p of P keeps K_p = 2(P-p)-1
forward tasks (eq. 3). Between consecutive execution steps sits a
communication step. All devices are used (the goal is min_p Q(L, N, p)).

**Our reading of the latency formulas.** The steps s = 0..S-1 alternate
execution and communication; E^s = E_f^s + E_b^s. An execution step's E_f,
E_b are the slowest device's FP and BP time under Algorithm 1's shares
(eq. 8, :mod:`ecofl.pipeline.planners.allocation`); a communication step's
are the micro-batch's activation (gradient) bytes over the slowest link
between the two groups (here: between the head group and *any* device after
it, which is the same on pools with uniform links). Then

- eq. 5: T_w^s = sum_{i<s} E_f^i; T_a^s = 2(|G|-1)/|G| * W_s / (slowest link in G_s);
- eq. 6: with dominant step dm, T_e^s = M E^dm + sum_{i=s}^{dm-1} E^i for
  s < dm and M E^dm - sum_{i=dm}^{s-1} E^i for s >= dm;
- eq. 11: the dominant step is the one with the largest *aligned* time,
  V = max_k ( M E^k + sum_{i<k} E^i );
- eq. 4: latency = max_s (T_w^s + T_e^s + T_a^s).

Substituting, every step ends its execution phase at V - sum_{i<s} E_b^i, so

    latency = V + max(0, W),   W = max over execution steps s of (T_a^s - sum_{i<s} E_b^i).

**The DP** (eq. 10) builds pipelines from the tail: Q(l, n, p) covers the
last l layers with the last n devices in p stages. Prepending an execution
step ne and a communication step nc to a sub-pipeline (V', W') gives
V = max(V' + E^ne + E^nc, M E^ne, M E^nc + E^ne) (eq. 11) and
W = max(T_a^ne, W' - E_b^ne - E_b^nc) (W is kept clipped at 0, which changes
no latency). Both are monotone in (V', W') but the latency V + W is not a
function of Q' alone, so where Asteroid keeps one configuration per
Q(l, n, p), we keep the Pareto front of (V, W): the DP is then exact for the
cost model above (tests compare it with brute force over all groupings).
Each (head group, tail) step is a handful of numpy operations over
``[first layer, end layer, front point]`` arrays, and Algorithm 1 runs
vectorised over all layer ranges of a group at once.

**Devices.** If no plan fits with every device (one cannot hold any stage
beside the others), the device with the least memory is left out, and so
on, which is where the memory-sorted order would put it: last.

**Micro-batches.** Sizes are divisors of the mini-batch (M = batch / size)
tried from large to small as for the other planners; the latency of the
first ``sizes`` feasible ones (default 3) is compared and the fastest kept.
Algorithm 1's offloading block is max(1, size // 16) samples.

**Inference** (``objective="inference"``): the same DP over forward-only
steps: E_b = 0, communication steps carry activations only, nothing is
all-reduced (T_a = 0), so the latency is V = max_k (M E^k + sum_{i<k} E^i),
the time to stream M micro-batches; every stage keeps the three micro-batches
of a stream and memory is the inference memory
(:mod:`ecofl.pipeline.planners.tables`). The portal's transfers are two more
communication steps, its inputs before the first group and the predictions
after the last (:meth:`HppModel.portal_s`): prepending a step E gives
V = max(V' + E, M E), appending one to the last group's E^e gives
max(M E^e, E^e + M E).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ecofl.devices import HomePool
from ecofl.pipeline.cost import ring_allreduce_s
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.planners.allocation import RangeTimes, allocate
from ecofl.pipeline.planners.memory import micro_batch_candidates, raise_infeasible, stage_in_flight
from ecofl.pipeline.planners.tables import batch_prefix, stage_tables
from ecofl.pipeline.profile import ModelProfile


@dataclass(frozen=True)
class Stage:
    """An execution step: devices order[a:b] run layers first..end-1 at distance r from the end."""

    a: int
    b: int
    first: int
    end: int


class HppModel:
    """Everything the HPP cost model needs at one micro-batch size."""

    def __init__(
        self, profile: ModelProfile, pool: HomePool, batch_size: int, micro_batch: int,
        block: int | None = None, devices: int | None = None, objective: str = "training",
    ):
        self.profile, self.pool = profile, pool
        self.micro_batch, self.num_micro_batches = micro_batch, batch_size // micro_batch
        self.block = block or max(1, micro_batch // 16)
        order = sorted(range(len(pool)), key=lambda d: (-pool.devices[d].memory_bytes, -pool.devices[d].speed, d))
        self.order = order[: devices or len(pool)]  # the ``devices`` with the most memory
        self.tables = stage_tables(profile, micro_batch, objective)
        self.training = objective == "training"
        self.forward, self.backward = batch_prefix(profile, micro_batch, objective)
        n = profile.num_layers
        self.act = np.zeros(n + 1)
        self.act[1:n] = profile.activation_bytes[:-1]
        self.grad = np.zeros(n + 1)
        if self.training:
            self.grad[1:n] = profile.gradient_bytes[1:]

    def _group(self, a: int, b: int) -> list[int]:
        return self.order[a:b]

    def _slowest_link(self, left: list[int], right: list[int]) -> float:
        links = self.pool.bandwidth_bps[np.ix_(left, right)]
        return float(links.min())

    def allreduce_s(self, a: int, b: int, weights: np.ndarray) -> np.ndarray:
        """Eq. 5: T_a = 2(|G|-1)/|G| * W / (slowest link in G); 0 for one device and for inference."""
        g = b - a
        if g == 1 or not self.training:
            return np.zeros_like(weights)
        return ring_allreduce_s(weights, g, self._slowest_link(self._group(a, b), self._group(a, b)))

    def portal_s(self, a: int, b: int) -> tuple[float, float]:
        """Inference: seconds of a micro-batch's inputs from the portal to group order[a:b], and of its outputs back.

        The whole micro-batch over the slowest link between the portal and the
        group's other devices (as :meth:`comm_s` counts a communication step);
        0 if the group is the portal alone, and for training.
        """
        others = [d for d in self._group(a, b) if d != 0]
        if self.training or not others:
            return 0.0, 0.0
        to_group = self.micro_batch * self.tables.input_bytes / self._slowest_link([0], others)
        to_portal = self.micro_batch * self.tables.output_bytes / self._slowest_link(others, [0])
        return to_group, to_portal

    def comm_s(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """E_f, E_b of the communication step after group order[a:b], per cut j (layer j starts the tail)."""
        bandwidth = self._slowest_link(self._group(a, b), self.order[b:])
        return self.micro_batch * self.act / bandwidth, self.micro_batch * self.grad / bandwidth

    def execute(self, a: int, b: int, r: int, first: np.ndarray, end: np.ndarray):
        """Algorithm 1 on group order[a:b] at distance r from the end for ranges first..end-1.

        Returns shares [R, g], E_f [R], E_b [R] (inf where infeasible) and T_a [R].
        """
        devices = self._group(a, b)
        budgets = np.array([self.pool.devices[d].memory_bytes for d in devices], dtype=float)
        t = self.tables
        static = (t.static[end] - t.static[first])[:, None]
        tasks = t.in_flight_target(r + 1, 0)  # r stages follow this one
        stash = t.resident_span[first, end][:, None] * tasks + t.transient_span[first, end][:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            caps = np.where(stash > 0, np.floor((budgets - static) / stash), self.micro_batch)
        caps = np.where((static > budgets).any(axis=1, keepdims=True), 0, caps)
        times = RangeTimes(self.forward, self.backward, first, end, [self.pool.devices[d].speed for d in devices])
        shares, ok = allocate(times, caps, self.micro_batch, self.block)
        f, bwd = times.split(shares)
        e_f = np.where(ok, f.max(axis=1), np.inf)
        e_b = np.where(ok, bwd.max(axis=1), np.inf)
        return shares, e_f, e_b, self.allreduce_s(a, b, t.weights[end] - t.weights[first])

    def latency(self, stages: list[Stage]) -> float:
        """Eqs. 4-6 and 11 evaluated literally for a pipeline of execution steps (comm steps between)."""
        steps = []  # (E_f, E_b, T_a)
        if not self.training:
            steps.append((self.portal_s(stages[0].a, stages[0].b)[0], 0.0, 0.0))
        for s, st in enumerate(stages):
            r = len(stages) - 1 - s
            _, e_f, e_b, t_a = self.execute(st.a, st.b, r, np.array([st.first]), np.array([st.end]))
            steps.append((e_f[0], e_b[0], t_a[0]))
            if s < len(stages) - 1:
                c_f, c_b = self.comm_s(st.a, st.b)
                steps.append((c_f[st.end], c_b[st.end], 0.0))
        if not self.training:
            steps.append((self.portal_s(stages[-1].a, stages[-1].b)[1], 0.0, 0.0))
        e = np.array([f + b for f, b, _ in steps])
        if not np.isfinite(e).all():
            return float("inf")
        m = self.num_micro_batches
        aligned = m * e + np.concatenate(([0.0], np.cumsum(e)[:-1]))
        dm = int(np.argmax(aligned))  # eq. 11
        worst = 0.0
        for s, (_, _, t_a) in enumerate(steps):
            t_w = sum(f for f, _, _ in steps[:s])  # eq. 5
            t_e = m * e[dm] + (e[s:dm].sum() if s < dm else -e[dm:s].sum())  # eq. 6
            worst = max(worst, t_w + t_e + t_a)  # eq. 4
        return float(worst)

    def stage_plan(self, stage: Stage, r: int, num_stages: int) -> StagePlan:
        shares, *_ = self.execute(stage.a, stage.b, r, np.array([stage.first]), np.array([stage.end]))
        devices = tuple(self._group(stage.a, stage.b))
        layers = (stage.first, stage.end - 1)
        budgets = [self.pool.devices[d].memory_bytes for d in devices]
        target = self.tables.in_flight_target(r + 1, 0)
        k = stage_in_flight(self.tables, layers, tuple(int(y) for y in shares[0]), budgets, target,
                            self.num_micro_batches)
        return StagePlan(layers=layers, devices=devices, shares=tuple(int(y) for y in shares[0]), in_flight=k)


def _exec_matrices(model: HppModel, a: int, b: int, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """E = E_f + E_b, E_b and T_a as ``[first, end]`` matrices over the ranges a stage there can cover."""
    n_layers = model.profile.num_layers
    size = n_layers + 1
    if r == 0:  # the last stage ends at L
        starts = np.arange(0, 1) if a == 0 else np.arange(1, n_layers)
        first, end = starts, np.full(len(starts), n_layers)
    else:  # r stages (>= r layers) follow; a head group starts at layer 0
        last_end = n_layers - r
        if a == 0:
            first, end = np.zeros(last_end, dtype=int), np.arange(1, last_end + 1)
        else:
            first, end = np.triu_indices(last_end + 1, k=1)
            keep = first >= 1
            first, end = first[keep], end[keep]
    e = np.full((size, size), np.inf)
    e_b = np.full((size, size), np.inf)
    t_a = np.zeros((size, size))
    if len(first):
        _, f, bwd, ta = model.execute(a, b, r, first, end)
        e[first, end], e_b[first, end], t_a[first, end] = f + bwd, bwd, ta
    return e, e_b, t_a


def _pareto(v: np.ndarray, w: np.ndarray, *pointers: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per row, the (V, W) points no other point beats in both; padded with V = inf."""
    order = np.lexsort((w, v), axis=-1)
    v, w = np.take_along_axis(v, order, -1), np.take_along_axis(w, order, -1)
    pointers = tuple(np.take_along_axis(p, order, -1) for p in pointers)
    best_before = np.concatenate((np.full((len(w), 1), np.inf), np.minimum.accumulate(w, axis=1)[:, :-1]), axis=1)
    keep = (w < best_before) & np.isfinite(v)
    width = max(1, int(keep.sum(axis=1).max()))
    slot = np.where(keep, np.cumsum(keep, axis=1) - 1, width)
    rows = np.broadcast_to(np.arange(len(v))[:, None], v.shape)
    out = []
    for x, fill in ((v, np.inf), (w, 0.0)) + tuple((p, -1) for p in pointers):
        packed = np.full((len(v), width + 1), fill, dtype=x.dtype)
        packed[rows, slot] = x
        out.append(packed[:, :width])
    return tuple(out)


def solve(model: HppModel) -> tuple[float, list[Stage]]:
    """Algorithm 2 with Pareto fronts: (latency, stages) minimising eq. 4; inf if nothing fits."""
    n_dev, n_layers, m = len(model.order), model.profile.num_layers, model.num_micro_batches
    fronts: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}
    for a in range(n_dev):
        e, _, t_a = _exec_matrices(model, a, n_dev, 0)
        v = (m * e[:, -1])[:, None]
        if not model.training:  # then the predictions go back to the portal
            to_portal = model.portal_s(a, n_dev)[1]
            v = np.maximum(v, (e[:, -1] + m * to_portal)[:, None])
        w = np.maximum(t_a[:, -1], 0.0)[:, None]
        fronts[(a, 1)] = (v, w, np.full_like(v, -1, dtype=int), np.full_like(v, -1, dtype=int),
                          np.full_like(v, -1, dtype=int))
    most_stages = min(n_dev, n_layers)  # every stage holds a layer
    for p in range(2, most_stages + 1):
        for a in range(n_dev - p, -1, -1):
            parts_v, parts_w, parts_b, parts_j, parts_k = [], [], [], [], []
            for b in range(a + 1, n_dev - p + 2):
                e, e_b, t_a = _exec_matrices(model, a, b, p - 1)
                c_f, c_b = model.comm_s(a, b)
                c = c_f + c_b
                tv, tw = fronts[(b, p - 1)][:2]  # [j, k]
                head = e[:, :, None]
                v = np.maximum(np.maximum(tv[None] + head + c[None, :, None], m * head),
                               (m * c + 0.0)[None, :, None] + head)
                w = np.maximum(np.maximum(t_a[:, :, None], tw[None] - e_b[:, :, None] - c_b[None, :, None]), 0.0)
                size = v.shape[0]
                shape = v.shape
                parts_v.append(v.reshape(size, -1))
                parts_w.append(w.reshape(size, -1))
                parts_b.append(np.full(shape, b).reshape(size, -1))
                parts_j.append(np.broadcast_to(np.arange(shape[1])[None, :, None], shape).reshape(size, -1))
                parts_k.append(np.broadcast_to(np.arange(shape[2])[None, None, :], shape).reshape(size, -1))
            fronts[(a, p)] = _pareto(*(np.concatenate(x, axis=1)
                                       for x in (parts_v, parts_w, parts_b, parts_j, parts_k)))
    best, choice = np.inf, None
    to_group = np.array([model.portal_s(0, b)[0] if b else 0.0 for b in range(n_dev + 1)])  # by the head group's end
    for p in range(1, most_stages + 1):
        v, w, head_end = fronts[(0, p)][:3]
        total = v[0] + w[0]
        if not model.training:  # the portal's inputs to the head group come first
            to_head = to_group[np.where(head_end[0] < 0, n_dev, head_end[0])]
            total = np.maximum(m * to_head, v[0] + to_head) + w[0]
        k = int(np.argmin(total))
        if total[k] < best:
            best, choice = float(total[k]), (p, k)
    if choice is None:
        return np.inf, []
    p, k = choice
    stages, a, i = [], 0, 0
    while True:
        _, _, b, j, k_next = (x[i, k] for x in fronts[(a, p)])
        if p == 1:
            stages.append(Stage(a, n_dev, i, n_layers))
            return best, stages
        stages.append(Stage(a, int(b), i, int(j)))
        a, i, k, p = int(b), int(j), int(k_next), p - 1


def plan_hpp(
    profile: ModelProfile, pool: HomePool, batch_size: int, micro_batch: int | None = None,
    sizes: int = 3, block: int | None = None, objective: str = "training",
) -> Plan:
    """Asteroid's HPP plan: the fastest of the first ``sizes`` feasible micro-batch sizes."""
    candidates = [micro_batch] if micro_batch else micro_batch_candidates(batch_size, len(pool))
    best: tuple[float, HppModel | None, list[Stage]] = (np.inf, None, [])
    for devices in range(len(pool), 0, -1):
        tried = 0
        for beta in candidates:
            model = HppModel(profile, pool, batch_size, beta, block, devices, objective)
            value, stages = solve(model)
            if np.isfinite(value):
                tried += 1
                if value < best[0]:
                    best = (value, model, stages)
                if tried == sizes:
                    break
        if best[1] is not None:
            break
    value, model, stages = best
    if model is None:
        raise_infeasible(profile, pool, "hpp", micro_batch=min(candidates), objective=objective)
        raise AssertionError("unreachable")
    plans = tuple(model.stage_plan(st, len(stages) - 1 - s, len(stages)) for s, st in enumerate(stages))
    return Plan(planner="hpp", stages=plans, micro_batch=model.micro_batch, num_micro_batches=model.num_micro_batches,
                schedule=model.tables.schedule)
