#!/usr/bin/env python3
# torch_link_bench.py — PyTorch on the measures of bench/cuda_link_bench.cpp, the same way: medians of
# CUDA-event timings, TF32 off; prints one JSON object on stdout with the same keys.
# Not here: ferry's side (cuda_link_bench) and the table of ratios (scripts/gpu-check).
import json
import sys

import torch

MB = 1 << 20  # bytes


def median_ms(warmup, reps, work):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(warmup):
        work()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start.record()
        work()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
        torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2]


def rate(ms, nbytes):
    return {"ms": ms, "bytes": nbytes, "GBps": nbytes / (ms * 1e-3) / 1e9}


def main():
    if not torch.cuda.is_available():
        print("torch_link_bench: no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    measures = {}
    for mb in (4, 256):
        reps = 30 if mb == 4 else 10
        pageable = torch.rand(mb * MB // 4)
        pinned = pageable.pin_memory()
        measures[f"h2d_pageable_{mb}MB"] = rate(median_ms(3, reps, lambda: pageable.to("cuda")), mb * MB)
        measures[f"h2d_pinned_{mb}MB"] = rate(
            median_ms(3, reps, lambda: pinned.to("cuda", non_blocking=True)), mb * MB)
    device = torch.rand(256 * MB // 4, device="cuda")
    nbytes = 256 * MB
    measures["d2h_pinned_256MB"] = rate(median_ms(3, 10, lambda: device.to("cpu", non_blocking=True)), nbytes)
    measures["d2h_pageable_256MB"] = rate(median_ms(3, 10, lambda: device.cpu()), nbytes)
    measures["d2d_256MB"] = rate(median_ms(3, 20, lambda: device.clone()), 2 * nbytes)
    other = torch.rand(256 * MB // 4, device="cuda")
    measures["add_3x256MB"] = rate(median_ms(3, 20, lambda: torch.add(device, other)), 3 * nbytes)
    # float32 -> 16-bit storage: 256 MB read, 128 MB written
    measures["to_bf16_256MB"] = rate(median_ms(3, 20, lambda: device.to(torch.bfloat16)), 1.5 * nbytes)
    measures["to_f16_256MB"] = rate(median_ms(3, 20, lambda: device.to(torch.float16)), 1.5 * nbytes)
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        ms = median_ms(2, 10 if n == 4096 else 5, lambda: torch.matmul(a, b))
        measures[f"gemm_fp32_{n}"] = {"ms": ms, "TFLOPs": 2.0 * n ** 3 / (ms * 1e-3) / 1e12}
    print(json.dumps({"library": "torch " + torch.__version__, "device": torch.cuda.get_device_name(0),
                      "measures": measures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
