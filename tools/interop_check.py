#!/usr/bin/env python3
"""interop_check.py — load a `ferry train` checkpoint into PyTorch's equivalent nn.Sequential (the fmnist CNN or
the mlp, as its metadata says) and evaluate it on Fashion-MNIST's test set; the accuracy must equal `ferry eval`'s.

Usage: /usr/bin/python3 tools/interop_check.py fmnist.safetensors [--data DIR] [--expect ACCURACY] [--limit-test N]
                                              [--save-weights F] [--save-weights-bf16 F]
Needs Debian's python3-torch (or any torch); parses safetensors with json + numpy, no other package.
"""
import argparse
import gzip
import json
import struct
import sys

import numpy as np
import torch
from torch import nn

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    metadata = header.pop("__metadata__", {})
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[base + begin : base + end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        tensors[name] = torch.from_numpy(array.copy())
    return tensors, metadata


def write_safetensors(path, tensors):
    """A state_dict as safetensors without metadata: what safetensors.torch.save_file(model.state_dict()) writes."""
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        bfloat16 = tensor.dtype == torch.bfloat16  # numpy has no bfloat16: its 16-bit patterns, named BF16
        array = tensor.view(torch.int16).numpy() if bfloat16 else tensor.numpy()
        blob = array.tobytes()
        dtype = "BF16" if bfloat16 else NAMES[array.dtype]
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def fmnist_model():
    layers, channels = [], 1
    for out in (32, 64, 128):
        layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(), nn.MaxPool2d(2)]
        channels = out
    layers += [nn.Flatten(), nn.Linear(128 * 3 * 3, 10)]
    return nn.Sequential(*layers)


def mlp_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


MODELS = {"fmnist": fmnist_model, "mlp": mlp_model}


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    return np.frombuffer(data[4 + 4 * ndim :], dtype=np.uint8).reshape(shape)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--expect", type=float, help="ferry's test accuracy (0-1); exit 1 if PyTorch's differs")
    parser.add_argument("--limit-test", type=int, help="score only the first N test images (as `ferry eval "
                        "--limit-test N`)")
    parser.add_argument("--save-weights", help="also write PyTorch's state_dict there as weights-only safetensors "
                        "(for `ferry eval --model`)")
    parser.add_argument("--save-weights-bf16", help="also write the state_dict in bfloat16 there (floating tensors "
                        "rounded; what a half-precision release of the model holds) and print the accuracy of the "
                        "rounded weights as test_accuracy_bf16")
    args = parser.parse_args()

    tensors, metadata = read_safetensors(args.checkpoint)
    weights = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    name = metadata.get("model", "fmnist")  # the model `ferry train --model` trained
    if name not in MODELS:
        print(f"{args.checkpoint}: model '{name}' has no PyTorch twin here ({', '.join(MODELS)})", file=sys.stderr)
        return 2
    model = MODELS[name]()
    model.load_state_dict(weights, strict=True)  # ferry's names are PyTorch's
    model.eval()
    if args.save_weights:
        write_safetensors(args.save_weights, model.state_dict())

    images = read_idx(f"{args.data}/t10k-images-idx3-ubyte.gz").astype(np.float32)
    labels = torch.from_numpy(read_idx(f"{args.data}/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    if args.limit_test is not None:
        if args.limit_test < 1:
            parser.error(f"--limit-test must be at least 1, got {args.limit_test}")
        images, labels = images[: args.limit_test], labels[: args.limit_test]
    # The same float32 arithmetic as ferry's loader: (x * (1/255) - mean) * (1/std).
    x = (images * np.float32(1 / 255) - np.float32(0.2860)) * np.float32(1 / 0.3530)
    x = torch.from_numpy(x).unsqueeze(1)

    def test_accuracy(net):
        with torch.no_grad():
            predictions = torch.cat([net(x[i : i + 1000]).argmax(1) for i in range(0, len(x), 1000)])
        return (predictions == labels).float().mean().item()

    accuracy = test_accuracy(model)
    result = {"test_accuracy": accuracy, "model": name, "tensors": len(weights), "epoch": metadata.get("epoch")}
    if args.save_weights_bf16:
        rounded = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in model.state_dict().items()}
        write_safetensors(args.save_weights_bf16, rounded)
        twin = MODELS[name]()  # float32 arithmetic on the rounded weights: what ferry does after widening them
        twin.load_state_dict({k: v.float() if v.dtype == torch.bfloat16 else v for k, v in rounded.items()})
        twin.eval()
        result["test_accuracy_bf16"] = test_accuracy(twin)
    print(json.dumps(result))
    if args.expect is not None and abs(accuracy - args.expect) > 1e-4:
        print(f"PyTorch's accuracy {accuracy:.4f} differs from ferry's {args.expect:.4f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
