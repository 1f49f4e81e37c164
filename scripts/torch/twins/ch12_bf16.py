"""Chapter 12's PyTorch twin: DDP with
PyTorch's own `bf16_compress_hook`, which casts each bucket to bfloat16,
divides it by the world size in bf16, all-reduces it and copies the result
back into the float32 bucket. Checks, in every step, that every averaged
gradient is a bf16 number (what travelled was bf16: on 2 ranks the sum of
two bf16 halves, rounded to bf16), that it is within the chapter's bound of
the exact mean of the ranks' own gradients, gamma_N = N u / (1 - N u) with
u = 2^-8, times the mean of their magnitudes (plus 2^-21 for float32's own
roundings), and that the replicas stay bitwise equal.

Run: GLOO_SOCKET_IFNAME=lo .venv/bin/torchrun --standalone --nproc-per-node 2 \
         scripts/torch/twins/ch12_bf16.py
(tests/torch_twins.rs runs it; it prints PASS or raises.)
"""

import copy
import gc

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import twin

STEPS, ROWS_PER_RANK = 4, 8

dist.init_process_group("gloo", init_method="env://")
world_size = dist.get_world_size()
batches, _ = twin.rank_batches(STEPS, ROWS_PER_RANK)  # this rank's rows
batches = [(x.float(), y.float()) for x, y in batches]

# ANCHOR: register
ddp = DDP(twin.mlp(seed=0).float())  # float32 buckets
ddp.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook)
# ANCHOR_END: register
optimizer = torch.optim.SGD(ddp.parameters(), lr=twin.LR)
local = copy.deepcopy(ddp.module)  # a plain copy: this rank's own gradient, computed another way

u = 2.0 ** -8
gamma = world_size * u / (1 - world_size * u) + 2.0 ** -21
worst = 0.0
for step, (bx, by) in enumerate(batches):
    what = f"step {step + 1}"
    local.load_state_dict(ddp.module.state_dict())
    local.zero_grad()
    twin.mse(local, bx, by).backward()
    own = torch.cat([p.grad.reshape(-1) for p in local.parameters()]).double()
    everyone = [torch.empty_like(own) for _ in range(world_size)]
    dist.all_gather(everyone, own)
    mean = sum(everyone) / world_size
    scale = sum(g.abs() for g in everyone) / world_size

    optimizer.zero_grad()
    twin.mse(ddp, bx, by).backward()  # each bucket through bf16_compress_hook
    synced = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()])
    if world_size == 2 and not torch.equal(synced, synced.bfloat16().float()):
        raise AssertionError(f"{what}: some averaged gradients are not bf16 numbers: float32 travelled")
    share = ((synced.double() - mean).abs() / (scale.clamp_min(1e-300) * gamma)).max().item()
    if not share <= 1.0:
        raise AssertionError(f"{what}: a gradient is {share:.3f} times the bound away from the exact mean")
    worst = max(worst, share)
    optimizer.step()
    twin.check_replicas_equal(what, ddp.parameters())

twin.report(f"ch12 bf16_compress_hook, {world_size} ranks, {STEPS} steps: gradients are bf16 numbers, "
            f"the worst at {worst:.3f} of the bound (gamma_{world_size} = {gamma:.2e}); replicas equal: PASS")
del ddp  # DDP's reducer holds the group: free it before the group (see twin.py)
gc.collect()
dist.destroy_process_group()
twin.leave()  # skips the interpreter's shutdown (scripts/torch/teardown.py)
