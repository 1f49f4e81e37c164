"""PyTorch's FSDP2 as chapter 14 shows it: `fully_shard` on each block,
then on the root, `reshard_after_forward`, and `set_requires_gradient_sync`
for accumulation, on CPU with gloo in float64. Run by
tests/torch_fully_shard.rs under `torchrun --standalone --nproc-per-node 2`;
prints, per rank, the rows of each parameter it keeps (its local shard) and
whether the parameters are sharded between forward and backward, for the
test to compare with the workbook's `shard_rows` and schedule.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from teardown import leave


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.linear(x))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 7)
        self.blocks = torch.nn.ModuleList([Block(7), Block(7)])
        self.head = torch.nn.Linear(7, 1)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    reshard = sys.argv[1] == "true"
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = Model().double()
    # ANCHOR: fully_shard
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    # ANCHOR_END: fully_shard
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64)
    micro_batches = [(x[:4], y[:4]), (x[4:], y[4:])]
    # ANCHOR: accumulate
    for i, (xs, ys) in enumerate(micro_batches):
        model.set_requires_gradient_sync(i == len(micro_batches) - 1)  # no_sync on all but the last
        loss = torch.nn.functional.mse_loss(model(xs), ys) / len(micro_batches)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    # ANCHOR_END: accumulate
    loss = torch.nn.functional.mse_loss(model(x), y)
    # Between forward and backward, a block's registered parameter is its
    # sharded DTensor when it was resharded, the full tensor when kept.
    kind = type(model.blocks[0].linear.weight).__name__
    lines = [f"rank {rank} block parameter between forward and backward: {kind}"]
    loss.backward()
    for name, param in model.named_parameters():
        lines.append(f"rank {rank} {name} full_rows {param.shape[0]} local_rows {param.to_local().shape[0]}")
    # Rank 0 prints every rank's lines: two processes' prints would interleave.
    every = [None] * world
    dist.all_gather_object(every, lines)
    if rank == 0:
        print("\n".join(line for rank_lines in every for line in rank_lines), flush=True)
    dist.destroy_process_group()
    leave()  # skips the interpreter's shutdown (scripts/torch/teardown.py)


if __name__ == "__main__":
    main()
