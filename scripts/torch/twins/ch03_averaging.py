"""scripts/torch/twins/ch03_averaging.py: chapter 3's PyTorch twin: the
gradient averaged by hand with all_reduce after backward, no DDP wrapper.
Checks that after every step the replicas are bitwise equal and within
1e-12 of one process training on the global batch.

Run: GLOO_SOCKET_IFNAME=lo .venv/bin/torchrun --standalone --nproc-per-node 2 \
         scripts/torch/twins/ch03_averaging.py
(tests/torch_twins.rs runs it; it prints PASS or raises.)
"""

import torch
import torch.distributed as dist

import twin

STEPS, ROWS_PER_RANK = 4, 6

# ANCHOR: init
dist.init_process_group("gloo", init_method="env://")  # torchrun's env: RANK, WORLD_SIZE, MASTER_ADDR/PORT
rank, world_size = dist.get_rank(), dist.get_world_size()
model = twin.mlp(seed=0)  # the same seed on every rank: equal replicas
# ANCHOR_END: init
optimizer = torch.optim.SGD(model.parameters(), lr=twin.LR)

x, y = twin.regression(STEPS * ROWS_PER_RANK * world_size)
global_batches = list(zip(x.chunk(STEPS), y.chunk(STEPS)))
reference = twin.one_process(global_batches)

largest = 0.0
for step, (gx, gy) in enumerate(global_batches):
    mine = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)  # this rank's rows
    optimizer.zero_grad()
    twin.mse(model, gx[mine], gy[mine]).backward()  # the mean over this rank's rows
    # ANCHOR: average
    for param in model.parameters():
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)  # every rank gets the sum
        param.grad /= world_size  # the mean of the ranks' means: the global batch's gradient
    # ANCHOR_END: average
    optimizer.step()
    twin.check_replicas_equal(f"step {step + 1}", model.parameters())
    largest = max(largest, twin.check_against_one_process(f"step {step + 1}", model.parameters(), reference[step]))

twin.report(f"ch03 averaging by hand, {world_size} ranks, {STEPS} steps: replicas equal, "
            f"largest difference from one process {largest:.1e}: PASS")
# ANCHOR: destroy
dist.destroy_process_group()
# ANCHOR_END: destroy
