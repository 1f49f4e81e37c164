"""The indices PyTorch's DistributedSampler
hands every rank, for many data set lengths, world sizes, drop_last, seeds and
epochs, printed as one JSON object on stdout. tests/torch_sampler.rs runs it
once and checks that the workbook's DistributedSampler hands out the same.

Run: .venv/bin/python scripts/torch/sampler_indices.py > /tmp/indices.json
(no process group needed: num_replicas and rank are passed explicitly).
"""

import json

import torch
from torch.utils.data import DistributedSampler

# Lengths around every world size (padding that wraps more than once,
# drop_last with fewer examples than ranks), a few larger ones, and 10000,
# long enough that randperm's order would show any difference at once.
LENGTHS = list(range(1, 14)) + [64, 97, 1000, 10000]
WORLD_SIZES = [1, 2, 3, 4, 5, 8]
SEEDS = [0, 13, 2**40 + 7]
EPOCHS = [0, 1, 5]


class Length:
    """A data set that is only a length: the sampler reads nothing else."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def main():
    configurations = []
    for n in LENGTHS:
        for world_size in WORLD_SIZES:
            for drop_last in (False, True):
                for seed in SEEDS:
                    for epoch in EPOCHS:
                        shards = []
                        for rank in range(world_size):
                            sampler = DistributedSampler(
                                Length(n), num_replicas=world_size, rank=rank,
                                shuffle=True, seed=seed, drop_last=drop_last,
                            )
                            sampler.set_epoch(epoch)
                            shards.append(list(sampler))
                        configurations.append({
                            "len": n, "world_size": world_size, "drop_last": drop_last,
                            "seed": seed, "epoch": epoch, "shards": shards,
                        })
    print(json.dumps({"torch": torch.__version__, "configurations": configurations}))


if __name__ == "__main__":
    main()
