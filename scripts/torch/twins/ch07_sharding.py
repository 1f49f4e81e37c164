"""Chapter 7's PyTorch twin:
DistributedSampler and set_epoch feed a DataLoader on every rank, and DDP
trains on the shards. Checks that each epoch's shards are equal in length,
together cover the data set (23 examples, padded to 24), and change from
epoch to epoch; and that after every step the replicas are bitwise equal and
within 1e-12 of one process on the global batch the ranks' shards make.

Run: GLOO_SOCKET_IFNAME=lo .venv/bin/torchrun --standalone --nproc-per-node 2 \
         scripts/torch/twins/ch07_sharding.py
(tests/torch_twins.rs runs it; it prints PASS or raises.)
"""

import gc

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import twin

EPOCHS, MICRO_ROWS, LENGTH, SEED = 3, 3, 23, 13

dist.init_process_group("gloo", init_method="env://")
rank, world_size = dist.get_rank(), dist.get_world_size()
x, y = twin.regression(LENGTH)
ddp = DDP(twin.mlp(seed=0))
optimizer = torch.optim.SGD(ddp.parameters(), lr=twin.LR)
first_shards = []


def check_shards(epoch, shard):
    """Every rank's shard of this epoch; raises unless they are equal in
    length, cover the data set, and differ from epoch 0's."""
    shards = [torch.empty_like(shard) for _ in range(world_size)]
    dist.all_gather(shards, shard)
    covered = torch.cat(shards).unique().numel()
    if covered != LENGTH or len(set(len(s) for s in shards)) != 1:
        raise AssertionError(f"epoch {epoch}: the shards {shards} cover {covered} of {LENGTH} examples")
    if epoch == 0:
        first_shards.extend(shards)
    elif all(torch.equal(a, b) for a, b in zip(shards, first_shards)):
        raise AssertionError(f"epoch {epoch}: the same shards as epoch 0: set_epoch did nothing")
    return shards


reference = twin.OneProcess()
largest = 0.0

# ANCHOR: sampler
dataset = TensorDataset(x, y)
sampler = DistributedSampler(dataset, shuffle=True, seed=SEED, drop_last=False)  # rank, world from the group
loader = DataLoader(dataset, batch_size=MICRO_ROWS, sampler=sampler)  # fetches the sampler's rows
for epoch in range(EPOCHS):
    sampler.set_epoch(epoch)  # else every epoch repeats epoch 0's order
    # ANCHOR_END: sampler
    shards = check_shards(epoch, torch.tensor(list(sampler)))  # every rank's indices for this epoch
    # ANCHOR: steps
    for step, (bx, by) in enumerate(loader):
        optimizer.zero_grad()
        twin.mse(ddp, bx, by).backward()
        optimizer.step()
        # ANCHOR_END: steps
        rows = torch.cat([s[step * MICRO_ROWS:(step + 1) * MICRO_ROWS] for s in shards])  # the global batch
        expected = reference.step(x[rows], y[rows])
        what = f"epoch {epoch}, step {step + 1}"
        twin.check_replicas_equal(what, ddp.parameters())
        largest = max(largest, twin.check_against_one_process(what, ddp.parameters(), expected))

twin.report(f"ch07 DistributedSampler, {world_size} ranks, {LENGTH} examples, {EPOCHS} epochs: shards equal in length, "
            f"covering the data set, new every epoch; replicas equal, largest difference from one process "
            f"{largest:.1e}: PASS")
del ddp  # DDP's reducer holds the group: free it before the group (see twin.py)
gc.collect()
dist.destroy_process_group()
twin.leave()  # skips the interpreter's shutdown (scripts/torch/teardown.py)
