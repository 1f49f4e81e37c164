"""Chapter 11's PyTorch twin:
`ZeroRedundancyOptimizer` wrapping AdamW under DistributedDataParallel. It
shards the optimizer state by whole parameters (each rank gets a set of
tensors, balanced by size), not by slices of flat buckets; DDP still
all-reduces every gradient, and after its step each rank sends the
parameters it owns to the others. Checks that every step gives bitwise-equal
replicas within 1e-12 of one process with plain AdamW on the global batch,
and that each rank holds the moments of its own parameters only, together
exactly all of them (counted, printed).

Run: GLOO_SOCKET_IFNAME=lo .venv/bin/torchrun --standalone --nproc-per-node 2 \
         scripts/torch/twins/ch11_zero.py
(tests/torch_twins.rs runs it; it prints PASS or raises.)
"""

import gc

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import twin

STEPS, ROWS_PER_RANK = 3, 6
LR, WEIGHT_DECAY = 0.01, 0.1

dist.init_process_group("gloo", init_method="env://")
world_size = dist.get_world_size()
rows, _ = twin.rank_batches(STEPS, ROWS_PER_RANK)  # this rank's rows (the SGD reference is not used)
x, y = twin.regression(STEPS * ROWS_PER_RANK * world_size)
global_batches = list(zip(x.chunk(STEPS), y.chunk(STEPS)))

# One process, plain AdamW on each whole global batch.
single = twin.mlp(seed=0)
single_adamw = torch.optim.AdamW(single.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
reference = []
for gx, gy in global_batches:
    single_adamw.zero_grad()
    twin.mse(single, gx, gy).backward()
    single_adamw.step()
    reference.append([p.detach().clone() for p in single.parameters()])

# ANCHOR: zero
ddp = DDP(twin.mlp(seed=0))
# Each rank keeps AdamW's moments for its share of the parameters only.
optimizer = ZeroRedundancyOptimizer(
    ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=LR, weight_decay=WEIGHT_DECAY
)
# ANCHOR_END: zero
largest = 0.0
for step, (bx, by) in enumerate(rows):
    optimizer.zero_grad()
    twin.mse(ddp, bx, by).backward()  # DDP all-reduces every gradient, as without ZeRO
    optimizer.step()  # this rank's share stepped, then shared with the other ranks
    what = f"step {step + 1}"
    twin.check_replicas_equal(what, ddp.parameters())
    largest = max(largest, twin.check_against_one_process(what, ddp.parameters(), reference[step]))

# The moments this rank holds: the local optimizer's state, one entry per owned parameter.
mine = sum(s["exp_avg"].numel() + s["exp_avg_sq"].numel() for s in optimizer.optim.state.values())
everyone = [None] * world_size
dist.all_gather_object(everyone, mine)
total = 2 * sum(p.numel() for p in ddp.parameters())
if sum(everyone) != total or max(everyone) >= total:
    raise AssertionError(f"moment elements per rank {everyone} do not split the {total} of plain AdamW")
twin.report(
    f"ch11 ZeroRedundancyOptimizer(AdamW), {world_size} ranks, {STEPS} steps: {largest:.1e} from one process; "
    f"moment elements per rank {everyone} of {total}: PASS"
)
del ddp, optimizer  # DDP's reducer holds the group: free it before the group (see twin.py)
gc.collect()
dist.destroy_process_group()
twin.leave()  # skips the interpreter's shutdown (scripts/torch/teardown.py)
