"""Chapter 4's PyTorch twin:
DistributedDataParallel with gradient accumulation, the first micro-batches
under `no_sync()`, the last one synced. Checks that inside `no_sync` the
ranks' gradients still differ (nothing was sent), and that after every step
the replicas are bitwise equal and within 1e-12 of one process on the
global batch.

Run: GLOO_SOCKET_IFNAME=lo .venv/bin/torchrun --standalone --nproc-per-node 2 \
         scripts/torch/twins/ch04_accumulation.py
(tests/torch_twins.rs runs it; it prints PASS or raises.)
"""

import gc

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import twin

STEPS, MICRO_BATCHES, MICRO_ROWS = 3, 3, 4

dist.init_process_group("gloo", init_method="env://")
rank, world_size = dist.get_rank(), dist.get_world_size()
# ANCHOR: wrap
ddp = DDP(twin.mlp(seed=0))  # broadcasts rank 0's weights, registers a hook per parameter
optimizer = torch.optim.SGD(ddp.parameters(), lr=twin.LR)
# ANCHOR_END: wrap

batches, reference = twin.rank_batches(STEPS, MICRO_BATCHES * MICRO_ROWS)  # this rank's rows, one process on all


def gradients_differ_between_ranks():
    grad = ddp.module.layers[0].weight.grad.clone()
    everyone = [torch.empty_like(grad) for _ in range(world_size)]
    dist.all_gather(everyone, grad)
    return not all(torch.equal(g, everyone[0]) for g in everyone)


largest = 0.0
for step, (bx, by) in enumerate(batches):
    micro_batches = list(zip(bx.chunk(MICRO_BATCHES), by.chunk(MICRO_BATCHES)))
    # ANCHOR: accumulate
    with ddp.no_sync():  # backward only accumulates into .grad; no all-reduce
        for mx, my in micro_batches[:-1]:
            (twin.mse(ddp, mx, my) / MICRO_BATCHES).backward()
    mx, my = micro_batches[-1]  # the last micro-batch outside no_sync: its backward
    (twin.mse(ddp, mx, my) / MICRO_BATCHES).backward()  # all-reduces the accumulated sum
    optimizer.step()
    optimizer.zero_grad()
    # ANCHOR_END: accumulate
    twin.check_replicas_equal(f"step {step + 1}", ddp.parameters())
    largest = max(largest, twin.check_against_one_process(f"step {step + 1}", ddp.parameters(), reference[step]))

# The control: under no_sync alone, each rank keeps its own gradient.
with ddp.no_sync():
    twin.mse(ddp, *twin.regression(MICRO_ROWS, seed=10 + rank)).backward()
if not gradients_differ_between_ranks():
    raise AssertionError("a backward inside no_sync() left every rank the same gradient: it was synced")
optimizer.zero_grad()

twin.report(f"ch04 no_sync accumulation, {world_size} ranks x {MICRO_BATCHES} micro-batches, {STEPS} steps: "
            f"replicas equal, largest difference from one process {largest:.1e}; "
            f"inside no_sync the gradients differ: PASS")
del ddp  # DDP's reducer holds the group: free it before the group (see twin.py)
gc.collect()
dist.destroy_process_group()
twin.leave()  # skips the interpreter's shutdown (scripts/torch/teardown.py)
