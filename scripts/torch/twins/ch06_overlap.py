"""Chapter 6's PyTorch twin: DDP
starts each bucket's all-reduce while backward is still computing the
gradients of earlier layers. A communication hook (`register_comm_hook`)
that records when it is called, around PyTorch's own all-reduce hook,
shows it. Checks that, in every step after the first, the bucket holding
the last layers is sent before backward has produced the first layer's
gradient, and that the replicas are bitwise equal and within 1e-12 of one
process on the global batch.

Run: GLOO_SOCKET_IFNAME=lo .venv/bin/torchrun --standalone --nproc-per-node 2 \
         scripts/torch/twins/ch06_overlap.py
(tests/torch_twins.rs runs it; it prints PASS or raises.)
"""

import gc

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import twin

STEPS, ROWS_PER_RANK = 3, 6

dist.init_process_group("gloo", init_method="env://")
world_size = dist.get_world_size()
batches, reference = twin.rank_batches(STEPS, ROWS_PER_RANK)  # this rank's rows, and one process on all

ddp = DDP(twin.mlp(seed=0), bucket_cap_mb=0.001)  # 2 buckets from step 2: layers 2 and 1, then layer 0
optimizer = torch.optim.SGD(ddp.parameters(), lr=twin.LR)
events = []  # what happened during backward, in order

# ANCHOR: comm_hook
def recording_all_reduce(state, bucket):
    # Called by DDP's reducer, during backward, as soon as every gradient of
    # `bucket` is ready; returns a future that completes with the averaged bucket.
    events.append(f"bucket {bucket.index()} sent")
    return default_hooks.allreduce_hook(state, bucket)  # async all_reduce, then / world_size


ddp.register_comm_hook(state=None, hook=recording_all_reduce)
# ANCHOR_END: comm_hook
ddp.module.layers[0].weight.register_post_accumulate_grad_hook(
    lambda _: events.append("layers.0.weight's gradient ready"))

largest = 0.0
for step, (bx, by) in enumerate(batches):
    events.clear()
    optimizer.zero_grad()
    twin.mse(ddp, bx, by).backward()  # returns once every bucket's future completed
    optimizer.step()
    what = f"step {step + 1}"
    twin.check_replicas_equal(what, ddp.parameters())
    largest = max(largest, twin.check_against_one_process(what, ddp.parameters(), reference[step]))
    if step > 0:  # the first step runs on one bucket; DDP rebuilds them after it
        first_layer = events.index("layers.0.weight's gradient ready")
        if "bucket 0 sent" not in events[:first_layer]:
            raise AssertionError(f"{what}: no bucket was sent before backward reached layer 0: {events}")

twin.report(f"ch06 overlap, {world_size} ranks, {STEPS} steps: backward's order {events}; "
            f"replicas equal, largest difference from one process {largest:.1e}: PASS")
del ddp  # DDP's reducer holds the group: free it before the group (see twin.py)
gc.collect()
dist.destroy_process_group()
twin.leave()  # skips the interpreter's shutdown (scripts/torch/teardown.py)
