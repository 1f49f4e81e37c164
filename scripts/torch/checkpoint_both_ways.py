"""The PyTorch side of
tests/torch_checkpoint.rs, checkpoints both ways between the workbook and
PyTorch, through safetensors files:

  held-out-loss CHECKPOINT HELD_OUT
      loads the `model.*` tensors of a workbook training checkpoint into the
      GPT twin (scripts/torch/models.py, strict: every name must match) and
      prints, as JSON, its masked loss and accuracy on the held-out
      sequences in HELD_OUT (inputs, targets, mask, written by the test),
      computed as src/data.rs's masked_cross_entropy and masked_accuracy;
  save-state-dict FOLDER
      writes a GPT twin's `state_dict()` with `safetensors.torch.save_file`
      to FOLDER/gpt.safetensors (float64, PyTorch's own initialisation), and
      tokens with the twin's logits for them to FOLDER/forward.safetensors.

Run: .venv/bin/python scripts/torch/checkpoint_both_ways.py save-state-dict /tmp/out
"""

import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import Gpt, GptConfig  # noqa: E402  (the workbook's GPT, same names)


def held_out_loss(checkpoint_path, held_out_path):
    saved = load_file(checkpoint_path)
    weights = {name[len("model."):]: t for name, t in saved.items() if name.startswith("model.")}
    model = Gpt(GptConfig()).to(next(iter(weights.values())).dtype)
    model.load_state_dict(weights, strict=True)
    data = load_file(held_out_path)
    inputs, targets, mask = data["inputs"], data["targets"], data["mask"]
    with torch.no_grad():
        logits = model(inputs)  # [n, seq, vocab]
        mask = mask.to(logits.dtype)
        log_probs = logits.log_softmax(-1)
        picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [n, seq]
        loss = -(picked * mask).sum() / mask.sum()
        correct = (logits.argmax(-1) == targets).double()
        accuracy = (correct * mask.double()).sum() / mask.double().sum()
    print(json.dumps({"loss": loss.item(), "accuracy": accuracy.item(), "dtype": str(logits.dtype)}))


def save_state_dict(folder):
    torch.manual_seed(5)
    model = Gpt(GptConfig()).double()
    save_file(model.state_dict(), os.path.join(folder, "gpt.safetensors"))
    tokens = torch.randint(0, GptConfig().vocab_size, (3, 32), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        logits = model(tokens)  # [3, 32, vocab]
    save_file({"tokens": tokens, "logits": logits}, os.path.join(folder, "forward.safetensors"))
    print(json.dumps({"parameters": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "held-out-loss":
        held_out_loss(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "save-state-dict":
        save_state_dict(sys.argv[2])
    else:
        sys.exit(__doc__)
