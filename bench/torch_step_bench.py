#!/usr/bin/env python3
"""torch_step_bench.py — PyTorch's side of `ferry bench golden` on a GPU: the same mlp and cnn workloads
(DESIGN.md; ferry::make_mlp_model, ferry::make_cnn_model(3, 32)), the same step (zero_grad, forward,
cross-entropy, backward, SGD lr 0.01 momentum 0.9) on a resident random batch, timed the same way (warm-up,
then one sync at the end of the timed block), and the peak device memory of that loop
(torch.cuda.max_memory_allocated). fp32, TF32 off, cudnn.benchmark on, as ../shared/ANCHORS.md measured.
Prints one JSON object: {"library", "device", "workloads": {name: {batch, resident_s, item_every_step_s,
peak_device_bytes}}}. Not here: ferry's side (ferry bench golden --json) and the ratios (scripts/gpu-check).
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def cnn(in_channels=3, side=32):
    layers, c = [], in_channels
    for out in (32, 64, 128):
        layers += [nn.Conv2d(c, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(), nn.MaxPool2d(2)]
        c = out
    pooled = side // 2 // 2 // 2
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(128 * pooled * pooled, 10))


def seconds_per_step(device, warmup, steps, body):
    for i in range(warmup):
        body(i)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for i in range(steps):
        body(warmup + i)
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps


def run(name, device, steps, warmup):
    torch.manual_seed(0)
    model = (mlp() if name == "mlp" else cnn()).to(device).train()
    batch = 512 if name == "mlp" else 256
    shape = (batch, 784) if name == "mlp" else (batch, 3, 32, 32)
    x = torch.randn(shape, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(_, read=False):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if read:
            loss.item()

    # The peak of a step in steady state: the warm-up steps (cuDNN's algorithm search under cudnn.benchmark,
    # whose workspace PyTorch's allocator counts; ferry's search memory is cuDNN's own) are measured apart.
    torch.cuda.reset_peak_memory_stats(device)
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize(device)
    peak_warmup = torch.cuda.max_memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    resident = seconds_per_step(device, 0, steps, step)
    peak = torch.cuda.max_memory_allocated(device)
    item = seconds_per_step(device, warmup, steps, lambda i: step(i, read=True))
    return {"batch": batch, "resident_s": resident, "item_every_step_s": item, "peak_device_bytes": peak,
            "peak_device_bytes_warmup": peak_warmup}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--workloads", default="mlp,cnn")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("torch_step_bench: no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda:0")
    out = {"library": f"PyTorch {torch.__version__}", "device": torch.cuda.get_device_name(device), "workloads": {}}
    for name in a.workloads.split(","):
        out["workloads"][name] = run(name, device, a.steps, a.warmup)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
