"""A replicated stage's flush: its replicas sum their gradients and average their float buffers in one ring.

Two executors of a stage replicated over two devices (Asteroid's hybrid
stage, shares 3 and 1 of a micro-batch of 4), each on its own epoch mesh of
real sealed links, flush together; every all-reduce they make is counted.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ecofl.devices import DeviceSpec, HomePool
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.runtime.stage import ShareExecutor
from ecofl.pipeline.runtime.topology import worker_roles
from helpers import close_all, meshes

pytestmark = pytest.mark.timeout(120)

SHARES = (3, 1)


def replicated_stage_roles():
    pool = HomePool("p", tuple(DeviceSpec(f"d{i}", 1.0, 1 << 30, 1e7) for i in range(3)))
    plan = Plan("hand", (StagePlan((0, 1), (0, 1), SHARES, 2), StagePlan((2, 2), (2,), (4,), 1)), 4, 2)
    return [role for role in worker_roles(plan, pool, None, sleeps=False) if role.stage == 0]


def flush(modules: list[nn.Module]) -> list[int]:
    """Both replicas' gradient reduction at once; the all-reduces each made."""
    roles = replicated_stage_roles()
    listeners, ranks = meshes(2)
    calls = [0, 0]
    try:
        executors = [ShareExecutor(role, module, ranks[role.rank], timeout_s=30)
                     for role, module in zip(roles, modules)]
        for i, executor in enumerate(executors):
            reduce = executor.mesh.all_reduce

            def counted(*args, i=i, reduce=reduce, **kwargs):
                calls[i] += 1
                return reduce(*args, **kwargs)
            executor.mesh.all_reduce = counted
        rounds = [SimpleNamespace(stats=SimpleNamespace(events=[])) for _ in executors]
        threads = [threading.Thread(target=executor._reduce_grads, args=(r, -1))
                   for executor, r in zip(executors, rounds)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert all(len(r.stats.events) == 1 for r in rounds)  # one all-reduce event each, timed
    finally:
        close_all(listeners, ranks)
    return calls


def replica(seed: int, buffer_dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    module[1].num_batches_tracked.fill_(5 + seed)  # each replica's own count
    module[1].running_var = module[1].running_var.to(buffer_dtype)  # a replica's float buffers, possibly wider
    module[1].running_mean.uniform_(-1, 1)
    module[1].running_var.uniform_(0.5, 2)
    for p in module.parameters():
        p.grad = torch.randn_like(p)
    module[2].bias.grad = None  # a parameter the round did not reach: summed as zeros
    return module


def test_a_replicated_stage_sums_gradients_and_averages_buffers_by_share_in_one_ring():
    modules = [replica(0), replica(1)]
    grads = [[torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in m.parameters()] for m in modules]
    buffers = [[b.clone() for b in m.buffers() if b.is_floating_point()] for m in modules]
    calls = flush(modules)
    assert calls == [1, 1]  # gradients and buffers together: a slow device pays one ring's wake-ups
    weights = [share / sum(SHARES) for share in SHARES]
    for module in modules:
        for p, a, b in zip(module.parameters(), *grads):
            torch.testing.assert_close(p.grad, a + b)
        floats = [b for b in module.buffers() if b.is_floating_point()]
        for got, a, b in zip(floats, *buffers):
            torch.testing.assert_close(got, weights[0] * a + weights[1] * b)
    assert [m[1].num_batches_tracked.item() for m in modules] == [5, 6]  # integer buffers are each replica's own
    for p, q in zip(modules[0].parameters(), modules[1].parameters()):
        assert torch.equal(p.grad, q.grad)  # bitwise the same on both replicas


def test_buffers_of_another_float_type_take_a_ring_of_their_own():
    modules = [replica(0, torch.float64), replica(1, torch.float64)]
    weights = [share / sum(SHARES) for share in SHARES]
    var, mean = ([weights[0] * getattr(modules[0][1], name) + weights[1] * getattr(modules[1][1], name)
                  for name in ("running_var", "running_mean")])
    grad = modules[0][0].weight.grad + modules[1][0].weight.grad
    calls = flush(modules)
    assert calls == [2, 2]  # float32 (the gradients, running_mean), then float64 (running_var)
    for module in modules:
        assert module[1].running_var.dtype == torch.float64 and module[0].weight.grad.dtype == torch.float32
        torch.testing.assert_close(module[1].running_var, var)
        torch.testing.assert_close(module[1].running_mean, mean)
        torch.testing.assert_close(module[0].weight.grad, grad)


def test_a_replica_lost_mid_ring_leaves_the_survivors_gradients_and_buffers_as_they_were():
    """The peer's links close while the survivor waits in the ring: it raises, and what recovery restores from
    (its gradients and batch-norm statistics) is untouched, as the sum went into copies."""
    modules = [replica(0), replica(1)]
    reached = [p for p in modules[0].parameters() if p.grad is not None]
    grads, buffers = [p.grad.clone() for p in reached], [b.clone() for b in modules[0].buffers()]
    roles = replicated_stage_roles()
    listeners, ranks = meshes(2)
    try:
        survivor = ShareExecutor(roles[0], modules[0], ranks[0], timeout_s=30)
        ranks[1].close()  # the other replica is gone
        with pytest.raises(ConnectionError):
            survivor._reduce_grads(SimpleNamespace(stats=SimpleNamespace(events=[])), -1)
    finally:
        close_all(listeners, ranks)
    assert all(torch.equal(p.grad, g) for p, g in zip(reached, grads))
    assert all(torch.equal(b, before) for b, before in zip(modules[0].buffers(), buffers))
