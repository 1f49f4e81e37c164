"""Chapter 8's PyTorch twin: the
whole training loop. DDP, a DistributedSampler with set_epoch, gradient
accumulation under no_sync, rank 0 alone saving `model.module.state_dict()`
(the plain model's weights, without DDP's `module.` prefix), a barrier, and
destroy_process_group. Checks that the run equals one process on the same
global batches within 1e-12, and that the checkpoint loads, strictly, into
a plain model that equals every rank's replica bitwise.

Run: GLOO_SOCKET_IFNAME=lo .venv/bin/torchrun --standalone --nproc-per-node 2 \
         scripts/torch/twins/ch08_training_run.py
(tests/torch_twins.rs runs it; it prints PASS or raises.)
"""

import gc
import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import twin

EPOCHS, ACCUMULATION, MICRO_ROWS, LENGTH, SEED = 2, 2, 4, 48, 7

# ANCHOR: setup
dist.init_process_group("gloo", init_method="env://")
rank, world_size = dist.get_rank(), dist.get_world_size()
model = DDP(twin.mlp(seed=0))
optimizer = torch.optim.SGD(model.parameters(), lr=twin.LR)
x, y = twin.regression(LENGTH)
sampler = DistributedSampler(TensorDataset(x, y), seed=SEED)  # shuffled, tail padded
# ANCHOR_END: setup
# One folder for this run, the same name on every rank: torchrun --standalone
# gives each run its own id (broadcast_object_list would need numpy).
folder = os.path.join(tempfile.gettempdir(), f"ch08-twin-{os.environ['TORCHELASTIC_RUN_ID']}-{os.environ['MASTER_PORT']}")
checkpoint = os.path.join(folder, "model.pt")
if rank == 0:
    os.makedirs(folder)
reference = twin.OneProcess()
largest = 0.0

# ANCHOR: loop
for epoch in range(EPOCHS):
    sampler.set_epoch(epoch)
    shard = torch.tensor(list(sampler))  # this rank's indices, as many as every other rank's
    steps = [shard[i:i + ACCUMULATION * MICRO_ROWS] for i in range(0, len(shard), ACCUMULATION * MICRO_ROWS)]
    for step_indices in steps:
        micro = [step_indices[i:i + MICRO_ROWS] for i in range(0, len(step_indices), MICRO_ROWS)]
        with model.no_sync():  # all but the last micro-batch: accumulate locally
            for rows in micro[:-1]:
                (twin.mse(model, x[rows], y[rows]) / len(micro)).backward()
        (twin.mse(model, x[micro[-1]], y[micro[-1]]) / len(micro)).backward()  # syncs
        optimizer.step()
        optimizer.zero_grad()
        # ANCHOR_END: loop
        everyone = [torch.empty_like(step_indices) for _ in range(world_size)]
        dist.all_gather(everyone, step_indices)  # the global batch, for one process
        rows = torch.cat([indices[k * MICRO_ROWS:(k + 1) * MICRO_ROWS] for k in range(len(micro)) for indices in everyone])
        expected = reference.step(x[rows], y[rows])
        largest = max(largest, twin.check_against_one_process(f"epoch {epoch}", model.parameters(), expected))

# ANCHOR: checkpoint
if rank == 0:  # one writer; the replicas are equal, so any rank's weights would do
    torch.save(model.module.state_dict(), checkpoint)  # names without DDP's "module." prefix
dist.barrier()  # no rank reads the file (or leaves) before it is complete
plain = twin.mlp(seed=1)  # other weights, then replaced
plain.load_state_dict(torch.load(checkpoint), strict=True)
# ANCHOR_END: checkpoint
for name, loaded in plain.state_dict().items():
    if not torch.equal(loaded, model.module.state_dict()[name]):
        raise AssertionError(f"rank {rank}: the checkpoint's {name} differs from this rank's replica")
dist.barrier()
if rank == 0:
    os.remove(checkpoint)
    os.rmdir(folder)

twin.report(f"ch08 training loop, {world_size} ranks, {EPOCHS} epochs x {len(steps)} steps of {ACCUMULATION} "
            f"micro-batches: {largest:.1e} from one process; rank 0's checkpoint equals every replica: PASS")
# ANCHOR: destroy
del model  # DDP's reducer holds the group: free the wrapper first (its hooks form cycles, hence gc)
gc.collect()
dist.destroy_process_group()  # the group's sockets and threads, before the process exits
# ANCHOR_END: destroy
twin.leave()  # skips the interpreter's shutdown (scripts/torch/teardown.py)
