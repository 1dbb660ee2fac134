#!/usr/bin/python3
"""torch_fmnist.py — PyTorch's side of the fmnist epoch benchmark: the same CNN, data, settings and loop as
`ferry train` (DESIGN.md's fmnist workload), so that scripts/bench-cpu.sh and scripts/gpu-check can print
ferry / PyTorch for one epoch on the same machine in the same run. Not here: ferry's side (ferry train --json).

Same as ferry train: images (x / 255 - 0.2860) / 0.3530 resident on the device; batch 128, shuffled every epoch,
last short batch kept; SGD lr 0.05 (cosine over all steps, set before each step), momentum 0.9, weight decay
5e-4; the loss read back every 100 steps only; seconds per epoch count the training loop, not the test pass.
On cuda: fp32 with TF32 off and cudnn.benchmark on, the settings ../shared/ANCHORS.md measured with.
Prints one JSON object: device, threads, epochs, seconds_per_epoch, history (per epoch), test_accuracy.
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def load(folder, split, device):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"))
    x = (images.float() / 255.0 - 0.2860) / 0.3530
    return x.unsqueeze(1).to(device), labels.long().to(device)


def fmnist_model():
    layers, channels = [], 1
    for out in (32, 64, 128):
        layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(), nn.MaxPool2d(2)]
        channels = out
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(128 * 3 * 3, 10))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave PyTorch's default)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    if device.type == "cuda":  # as ../shared/ANCHORS.md measured: fp32 (ferry's default), cuDNN's algorithm search on
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    train_x, train_y = load(a.data, "train", device)
    test_x, test_y = load(a.data, "test", device)
    model = fmnist_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
    n = train_x.shape[0]
    steps_per_epoch = (n + a.batch - 1) // a.batch
    total_steps = a.epochs * steps_per_epoch
    generator = torch.Generator(device="cpu").manual_seed(a.seed)
    history, step = [], 0

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for epoch in range(a.epochs):
        model.train()
        synchronize()
        start = time.perf_counter()
        order = torch.randperm(n, generator=generator).to(device)
        loss_sum = torch.zeros((), device=device)
        for b in range(steps_per_epoch):
            idx = order[b * a.batch:(b + 1) * a.batch]
            x, y = train_x[idx], train_y[idx]
            for group in optimizer.param_groups:
                group["lr"] = a.lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * y.shape[0]
            step += 1
            if step % a.log_every == 0:
                value = loss.item()
                if not math.isfinite(value):
                    sys.exit(f"torch_fmnist: the loss became {value} at step {step}")
        train_loss = loss_sum.item() / n
        seconds = time.perf_counter() - start  # the training loop, as ferry's seconds_per_epoch
        model.eval()
        correct = 0
        with torch.no_grad():
            for b in range(0, test_x.shape[0], 1000):
                correct += (model(test_x[b:b + 1000]).argmax(1) == test_y[b:b + 1000]).sum().item()
        history.append({"epoch": epoch + 1, "seconds": seconds, "train_loss": train_loss,
                        "test_accuracy": correct / test_x.shape[0]})
        print(f"torch_fmnist: epoch {epoch + 1}: {seconds:.1f} s, loss {train_loss:.4f}, "
              f"test accuracy {correct / test_x.shape[0]:.4f}", file=sys.stderr)
    print(json.dumps({"library": "pytorch " + torch.__version__, "device": str(device),
                      "threads": torch.get_num_threads(), "epochs": a.epochs,
                      "seconds_per_epoch": sum(h["seconds"] for h in history) / len(history),
                      "test_accuracy": history[-1]["test_accuracy"], "history": history}))


if __name__ == "__main__":
    main()
