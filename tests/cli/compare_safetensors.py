#!/usr/bin/env python3
"""compare_safetensors.py A B [BOUND]: every float32 tensor of two safetensors files agrees, ||a - b|| / ||b|| <=
BOUND per tensor (default 1e-5: the DDP parity bound of tests/cli/test_ddp.sh and
tests/cuda_on_host/train_on_emulated_gpu.sh).
Prints the largest relative difference; exit status 1 when it is over the bound or the names differ.
Standard library only (no numpy on a fresh machine)."""
import array
import json
import math
import struct
import sys


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        begin, end = info["data_offsets"]
        out[name] = array.array("f", raw[base + begin:base + end])
    return out


a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
worst = 0.0
for name in a:
    diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(a[name], b[name])))
    norm = math.sqrt(sum(y * y for y in b[name])) or 1.0
    worst = max(worst, diff / norm)
print(f"  {len(a)} tensors, largest relative difference {worst:.2e}")
sys.exit(0 if worst <= (float(sys.argv[3]) if len(sys.argv) > 3 else 1e-5) else 1)
