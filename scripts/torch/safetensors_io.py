"""Read and write safetensors files with
torch alone, for the PyTorch side of the workbook (scripts/torch/). The
project's .venv has torch but neither the `safetensors` package nor numpy,
and the format is small: 8 bytes (little-endian u64) giving the length of a
JSON header, the header (name -> dtype, shape, byte offsets in the data),
then the data, row-major, little-endian.

    from safetensors_io import load_file, save_file
    tensors = load_file("weights.safetensors")    # {name: tensor}, CPU
    save_file({"w": torch.ones(2)}, "out.safetensors")

Checked by `cargo test --features solutions,mpi,nccl --test torch_oracle`:
the workbook writes every file the oracle reads, and reads every file it
writes.
"""

import ctypes
import json
import struct

import torch

# The dtypes the workbook writes and reads; safetensors names them so.
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {dtype: name for name, dtype in DTYPES.items()}


def load_file(path):
    """Every tensor of the safetensors file at `path`, by name, on the CPU."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    header.pop("__metadata__", None)
    body = memoryview(data)[8 + header_len :]
    tensors = {}
    for name, entry in header.items():
        if entry["dtype"] not in DTYPES:
            raise ValueError(f"{path}: tensor `{name}` has dtype {entry['dtype']}, which this reader does not know")
        start, end = entry["data_offsets"]
        dtype = DTYPES[entry["dtype"]]
        flat = torch.frombuffer(bytearray(body[start:end]), dtype=dtype) if end > start else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(entry["shape"])
    return tensors


def save_file(tensors, path):
    """Writes `{name: tensor}` to `path` as safetensors, names sorted."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        raw = _raw_bytes(tensor)
        header[name] = {"dtype": NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as the format asks
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for raw in chunks:
            f.write(raw)


def _raw_bytes(tensor):
    """A contiguous CPU tensor's bytes (numpy, the usual way, is not in the .venv)."""
    return ctypes.string_at(tensor.data_ptr(), tensor.numel() * tensor.element_size())
