"""Chapter 5's PyTorch twin:
DistributedDataParallel's gradient buckets, with the default cap (25 MB)
and with a cap of 1 KB (`bucket_cap_mb=0.001`), which splits the MLP's 369
float64 gradients (2952 bytes) over several buckets. Checks that both give
bitwise-equal replicas within 1e-12 of one process on the global batch (the
cap changes what travels together, never the numbers), and that the small
cap does make several buckets (`_get_ddp_logging_data()`, a private
PyTorch API: its "rebuilt_bucket_sizes", the buckets of every step after
the first).

Run: GLOO_SOCKET_IFNAME=lo .venv/bin/torchrun --standalone --nproc-per-node 2 \
         scripts/torch/twins/ch05_bucketing.py
(tests/torch_twins.rs runs it; it prints PASS or raises.)
"""

import gc

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import twin

STEPS, ROWS_PER_RANK = 3, 6

dist.init_process_group("gloo", init_method="env://")
world_size = dist.get_world_size()
batches, reference = twin.rank_batches(STEPS, ROWS_PER_RANK)  # this rank's rows, and one process on all

results = []
for cap_mb in (None, 0.001):
    # ANCHOR: buckets
    # bucket_cap_mb: the most bytes of gradient per all-reduce (default 25 MB;
    # the first bucket is capped at 1 MB once the buckets are rebuilt).
    caps = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
    ddp = DDP(twin.mlp(seed=0), **caps)
    # ANCHOR_END: buckets
    optimizer = torch.optim.SGD(ddp.parameters(), lr=twin.LR)
    largest = 0.0
    for step, (bx, by) in enumerate(batches):
        optimizer.zero_grad()
        twin.mse(ddp, bx, by).backward()  # each full bucket is all-reduced (averaged) in backward
        optimizer.step()
        what = f"cap {cap_mb} MB, step {step + 1}"
        twin.check_replicas_equal(what, ddp.parameters())
        largest = max(largest, twin.check_against_one_process(what, ddp.parameters(), reference[step]))
    bucket_sizes = ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]  # bytes per bucket: "2312, 640"
    results.append((cap_mb, bucket_sizes, largest))

default_sizes, small_sizes = results[0][1], results[1][1]
if not small_sizes.count(",") > default_sizes.count(","):
    raise AssertionError(f"a 1 KB cap should make more buckets than 25 MB: {small_sizes} against {default_sizes}")
summary = "; ".join(f"cap {cap or 'default'} MB: buckets {sizes} bytes, {diff:.1e} from one process"
                    for cap, sizes, diff in results)
twin.report(f"ch05 buckets, {world_size} ranks, {STEPS} steps: {summary}: PASS")
del ddp  # DDP's reducer holds the group: free it before the group (see twin.py)
gc.collect()
dist.destroy_process_group()
twin.leave()  # skips the interpreter's shutdown (scripts/torch/teardown.py)
