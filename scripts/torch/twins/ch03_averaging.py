"""Chapter 3's PyTorch twin: the
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

batches, reference = twin.rank_batches(STEPS, ROWS_PER_RANK)  # this rank's rows, and one process on all

largest = 0.0
for step, (bx, by) in enumerate(batches):
    optimizer.zero_grad()
    twin.mse(model, bx, by).backward()  # the mean over this rank's rows
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
twin.leave()  # skips the interpreter's shutdown (scripts/torch/teardown.py)
