#!/usr/bin/env python3
"""torch_char_transformer.py — PyTorch's side of examples/char_transformer: the same small GPT (token and position
Embedding, N x [LayerNorm, causal nn.MultiheadAttention, LayerNorm, Linear-GELU-Linear], LayerNorm, Linear), or
with --model lstm|gru the same char-rnn (Embedding, --layers of nn.LSTM or nn.GRU, batch first, Linear), the
same step (zero_grad, forward, cross-entropy, backward, clip_grad_norm_ 1.0, AdamW weight decay 0.1) on batches
picked from the text as the example picks them, timed after warm-up steps on the cpu or, with --device cuda, on the
GPU (between two synchronizations, the data resident there).
Prints one JSON object: {"library", "model", "device", "threads", "steps", "seconds_per_step", "final_loss"}.
Not here: ferry's side (char_transformer --json prints the same keys); docs/BENCHMARKS.md has both, run one after
the other on the same machine (scripts/gpu-check runs both on the card).
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x, mask):
        n = self.ln1(x)
        h = x + self.attn(n, n, n, attn_mask=mask, need_weights=False)[0]
        return h + self.down(F.gelu(self.up(self.ln2(h))))


class CharTransformer(nn.Module):
    def __init__(self, vocab, dim, heads, layers, context):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        x = self.tokens(ids) + self.positions(torch.arange(t))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


class CharRnn(nn.Module):
    def __init__(self, vocab, dim, layers, cell):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(dim, dim, num_layers=layers, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(self.rnn(self.tokens(ids))[0])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--model", choices=["gpt", "lstm", "gru"], default="gpt")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu or cuda (the data resident there, as ferry's example)")
    a = p.parse_args()
    device = torch.device(a.device)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    text = open(a.text, "rb").read()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.int64, device=device)
    if a.model == "gpt":
        model = CharTransformer(len(chars), a.dim, a.heads, a.layers, a.context)
    else:
        model = CharRnn(len(chars), a.dim, a.layers, a.model)
    model.to(device)
    matrices = [p for p in model.parameters() if p.dim() >= 2]  # as the example: no decay for biases and norms
    others = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": matrices}, {"params": others, "weight_decay": 0.0}], lr=3e-3,
                            weight_decay=0.1)
    offsets = torch.arange(a.context, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step():
        starts = torch.randint(0, data.numel() - a.context - 1, (a.batch, 1), device=device)
        where = (starts + offsets).reshape(-1)
        x = data[where].reshape(a.batch, a.context)
        y = data[where + 1].reshape(a.batch, a.context)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, len(chars)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    elapsed = time.perf_counter() - start
    print(json.dumps({"library": "torch " + torch.__version__, "model": a.model, "device": a.device,
                      "threads": a.threads, "steps": a.steps, "seconds_per_step": elapsed / a.steps,
                      "final_loss": loss.item()}))


if __name__ == "__main__":
    main()
