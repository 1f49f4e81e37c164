"""What the chapter twins share, so that each
chapter's script (chNN_*.py, next to this file) shows only PyTorch's DDP
lines and its checks: the workbook's MLP (scripts/torch/models.py) seeded
alike on every rank, the data, the one-process reference on the global
batch, and comparisons that raise with a message saying what differed.

Not run by itself; each twin imports it. Run a twin with
    GLOO_SOCKET_IFNAME=lo .venv/bin/torchrun --standalone --nproc-per-node 2 \
        scripts/torch/twins/ch03_averaging.py
(tests/torch_twins.rs runs them all).
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from models import Mlp  # noqa: E402  (the workbook's MLP, same parameter names)

SIZES = [4, 16, 16, 1]
LR = 0.05
# In float64 the distributed step and one process differ only in the order
# of additions (and PyTorch's division of each rank's share before the sum):
# about 1e-16 relative; 1e-12 is far above that and far below any real bug.
TOLERANCE = 1e-12


def mlp(seed=0):
    """The chapters' MLP in float64, with weights drawn from `seed`: every
    rank that passes the same seed starts from the same replica."""
    torch.manual_seed(seed)
    return Mlp(SIZES).double()


def regression(n, seed=1):
    """`n` rows of x in [n, 4] and y = sin(sum x) in [n, 1], from `seed`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, dtype=torch.float64, generator=g)
    return x, x.sum(1, keepdim=True).sin()


def mse(model, x, y):
    return F.mse_loss(model(x), y)  # the mean over the rows


class OneProcess:
    """The reference: one plain model from the same start, SGD on each whole
    global batch. `step(x, y)` returns its parameters after the step."""

    def __init__(self):
        self.model = mlp()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)

    def step(self, x, y):
        self.optimizer.zero_grad()
        mse(self.model, x, y).backward()
        self.optimizer.step()
        return [p.detach().clone() for p in self.model.parameters()]


def one_process(batches):
    """OneProcess's parameters after each of the global batches (x, y)."""
    reference = OneProcess()
    return [reference.step(x, y) for x, y in batches]


def rank_batches(steps, rows_per_rank):
    """For `steps` steps: this rank's rows of each global batch, as (x, y),
    and one process's parameters after training on each whole global batch
    (the ranks' rows together, in rank order)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x, y = regression(steps * rows_per_rank * world_size)
    global_batches = list(zip(x.chunk(steps), y.chunk(steps)))
    mine = slice(rank * rows_per_rank, (rank + 1) * rows_per_rank)
    return [(gx[mine], gy[mine]) for gx, gy in global_batches], one_process(global_batches)


def largest_difference(params, reference):
    return max((p.detach() - r).abs().max().item() for p, r in zip(params, reference))


def check_against_one_process(what, params, reference, tolerance=TOLERANCE):
    """Raises unless `params` are within `tolerance` of one process's."""
    diff = largest_difference(params, reference)
    if not diff <= tolerance:
        raise AssertionError(f"{what}: {diff:e} away from one process on the global batch (tolerance {tolerance:e})")
    return diff


def check_replicas_equal(what, params):
    """Raises unless every rank holds bitwise the same parameters."""
    mine = torch.cat([p.detach().reshape(-1) for p in params])
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    for rank, theirs in enumerate(everyone):
        if not torch.equal(theirs, mine):
            gap = (theirs - mine).abs().max().item()
            raise AssertionError(f"{what}: rank {rank}'s replica is {gap:e} from rank {dist.get_rank()}'s")


# Why the DDP twins `del` their wrapper and collect garbage before
# destroy_process_group: DDP's reducer holds the process group, so the group
# would outlive destroy_process_group until the interpreter's shutdown.
# Every twin then ends with `leave()` (scripts/torch/teardown.py), which
# skips that shutdown: a rank once aborted in it after printing PASS even
# without DDP (the ch03 twin, which has no reducer).
from teardown import leave  # noqa: E402,F401  (the twins call twin.leave())


def report(line):
    """Rank 0 prints; the test reads `PASS` from it."""
    if dist.get_rank() == 0:
        print(line, flush=True)
