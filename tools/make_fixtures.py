#!/usr/bin/python3
# make_fixtures.py — write PyTorch reference fixtures for ferry's nn and optim parity tests.
# Not a test: run it with Debian's python3-torch (`/usr/bin/python3 tools/make_fixtures.py`) when a case
# changes; the C++ tests (tests/test_nn_parity.cpp, tests/test_optim.cpp) read what it writes.
#
# Format: one safetensors file per case in tests/fixtures/nn/ (8-byte little-endian header length, a JSON
# header {"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}, then the raw little-endian
# data), written here with numpy + json so that no extra package is needed. Case settings (stride,
# momentum, lr, ...) sit in "__metadata__" as strings.
#
# Layer cases hold: input, the layer's parameters (and buffers), grad_output (a fixed random upstream
# gradient), output, and grad_<name> for the input and each parameter, from (output * grad_output).sum().
import json
import math
import os
import struct
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "nn")
DTYPES = {np.dtype("float32"): "F32", np.dtype("float64"): "F64", np.dtype("int64"): "I64", np.dtype("bool"): "BOOL",
          np.dtype("float16"): "F16"}


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    offset = 0
    blobs = []
    for name, value in tensors.items():
        bfloat16 = isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16  # numpy has no bfloat16: its bits
        if bfloat16:
            value = value.view(torch.int16)
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        array = np.array(array, order="C", copy=True)  # keeps 0-d tensors 0-d (ascontiguousarray would not)
        data = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": "BF16" if bfloat16 else DTYPES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def layer_case(name, module, input_shape, metadata, train=True, setup=None, steps=1):
    """Run `module` forward/backward on a fixed input; record everything the C++ test needs."""
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    x = torch.randn(*input_shape)
    tensors = {}
    if setup:
        setup(module)
    for key, value in module.state_dict().items():
        tensors["param." + key] = value.clone()
    module.train(train)
    x.requires_grad_(True)
    for step in range(steps):  # extra steps only move running statistics
        out = module(x)
        if step + 1 < steps:
            continue
        grad_output = torch.randn_like(out)
        (out * grad_output).sum().backward()
    tensors["input"] = x.detach()
    tensors["grad_output"] = grad_output
    tensors["output"] = out.detach()
    tensors["grad_input"] = x.grad
    for key, p in module.named_parameters():
        tensors["grad." + key] = p.grad
    for key, value in module.state_dict().items():
        tensors["after." + key] = value.clone()
    metadata = dict(metadata, train=int(train), steps=steps)
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors, metadata)


def rnn_case(name, module, input_shape, metadata, with_state):
    """A recurrent layer's output and final states, and the gradients of input, initial states and parameters."""
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    x = torch.randn(*input_shape, requires_grad=True)
    tensors = {"param." + key: value.clone() for key, value in module.state_dict().items()}
    directions = 2 if module.bidirectional else 1
    batch = [] if len(input_shape) == 2 else [input_shape[0] if module.batch_first else input_shape[1]]
    state_shape = [module.num_layers * directions] + batch + [module.hidden_size]
    lstm = isinstance(module, nn.LSTM)
    h0 = torch.randn(*state_shape, requires_grad=True) if with_state else None
    c0 = torch.randn(*state_shape, requires_grad=True) if with_state and lstm else None
    out, state = module(x, (h0, c0) if lstm and with_state else h0)
    h_n, c_n = state if lstm else (state, None)
    grad_output, grad_h_n = torch.randn_like(out), torch.randn_like(h_n)
    loss = (out * grad_output).sum() + (h_n * grad_h_n).sum()
    if lstm:
        grad_c_n = torch.randn_like(c_n)
        loss = loss + (c_n * grad_c_n).sum()
        tensors.update({"c_n": c_n.detach(), "grad_c_n": grad_c_n})
    loss.backward()
    tensors.update({"input": x.detach(), "output": out.detach(), "h_n": h_n.detach(), "grad_output": grad_output,
                    "grad_h_n": grad_h_n, "grad_input": x.grad})
    if with_state:
        tensors.update({"h0": h0.detach(), "grad_h0": h0.grad})
        if lstm:
            tensors.update({"c0": c0.detach(), "grad_c0": c0.grad})
    for key, p in module.named_parameters():
        tensors["grad." + key] = p.grad
    metadata = dict(metadata, layers=module.num_layers, hidden=module.hidden_size, input_size=module.input_size,
                    bias=int(module.bias), batch_first=int(module.batch_first),
                    bidirectional=int(module.bidirectional), with_state=int(with_state))
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors, metadata)


def randomise_norms(module):
    """LayerNorm's weight 1 and bias 0 would hide a swapped name: randomise every norm's parameters."""
    with torch.no_grad():
        for key, p in module.named_parameters():
            if "norm" in key:
                p.copy_(torch.rand_like(p) + 0.5 if key.endswith("weight") else torch.randn_like(p) * 0.1)


def encoder_case(name, module, input_shape, metadata, causal=False, padding=False):
    """A TransformerEncoderLayer or TransformerEncoder in training mode (dropout 0: PyTorch's reference path) with an
    optional causal float mask and a key padding mask; the output and the gradients of the input and parameters."""
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    randomise_norms(module)
    tensors = {"param." + key: value.clone() for key, value in module.state_dict().items()}
    x = torch.randn(*input_shape, requires_grad=True)
    batch_first = metadata["batch_first"] == 1
    length = input_shape[1] if batch_first else input_shape[0]
    batch = input_shape[0] if batch_first else input_shape[1]
    kw = {}
    if causal:
        key = "mask" if isinstance(module, nn.TransformerEncoder) else "src_mask"
        kw[key] = tensors["mask"] = nn.Transformer.generate_square_subsequent_mask(length)
    if padding:
        pad = torch.zeros(batch, length, dtype=torch.bool)
        pad[0, -2:] = True  # the first sequence's last two positions are padding
        kw["src_key_padding_mask"] = tensors["src_key_padding_mask"] = pad
    module.train()
    out = module(x, **kw)
    grad_output = torch.randn_like(out)
    (out * grad_output).sum().backward()
    tensors.update({"input": x.detach(), "output": out.detach(), "grad_output": grad_output, "grad_input": x.grad})
    for key, p in module.named_parameters():
        tensors["grad." + key] = p.grad
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors, metadata)


def decoder_case(name, module, tgt_shape, memory_shape, metadata, masks=()):
    """A TransformerDecoderLayer / TransformerDecoder (given tgt and memory) or a whole nn.Transformer (given src and
    tgt; metadata "transformer" 1) in training mode, dropout 0, with the masks named in `masks`: tgt_mask (causal,
    float), memory_mask (a random float mask), tgt_key_padding_mask, memory_key_padding_mask (bool, the last
    positions of the first sequence; src_key_padding_mask too, the same, for a Transformer). The output and the
    gradients of both inputs and every parameter."""
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    randomise_norms(module)
    tensors = {"param." + key: value.clone() for key, value in module.state_dict().items()}
    transformer = isinstance(module, nn.Transformer)
    tgt = torch.randn(*tgt_shape, requires_grad=True)
    memory = torch.randn(*memory_shape, requires_grad=True)  # the src of a Transformer
    batch_first = metadata["batch_first"] == 1
    length = lambda shape: shape[1] if batch_first else shape[0]
    batch = tgt_shape[0] if batch_first else tgt_shape[1]
    kw = {}
    if "tgt_mask" in masks:
        kw["tgt_mask"] = nn.Transformer.generate_square_subsequent_mask(length(tgt_shape))
    if "memory_mask" in masks:
        kw["memory_mask"] = torch.randn(length(tgt_shape), length(memory_shape))
    if "tgt_key_padding_mask" in masks:
        pad = torch.zeros(batch, length(tgt_shape), dtype=torch.bool)
        pad[0, -1:] = True
        kw["tgt_key_padding_mask"] = pad
    if "memory_key_padding_mask" in masks:
        pad = torch.zeros(batch, length(memory_shape), dtype=torch.bool)
        pad[0, -2:] = True
        kw["memory_key_padding_mask"] = pad
        if transformer:
            kw["src_key_padding_mask"] = pad
    tensors.update({"mask." + key: value for key, value in kw.items()})
    module.train()
    out = module(memory, tgt, **kw) if transformer else module(tgt, memory, **kw)
    grad_output = torch.randn_like(out)
    (out * grad_output).sum().backward()
    tensors.update({"tgt": tgt.detach(), "memory": memory.detach(), "output": out.detach(),
                    "grad_output": grad_output, "grad_tgt": tgt.grad, "grad_memory": memory.grad})
    for key, p in module.named_parameters():
        tensors["grad." + key] = p.grad
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors, dict(metadata, transformer=int(transformer)))


def decoder_cases():
    decoder_case("decoder_layer_post_norm_masks",
                 nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True), (3, 4, 8),
                 (3, 5, 8), {"d_model": 8, "nhead": 2, "ff": 16, "activation": "relu", "batch_first": 1,
                             "norm_first": 0, "layers": 0, "final_norm": 0},
                 masks=("tgt_mask", "tgt_key_padding_mask", "memory_key_padding_mask"))
    decoder_case("decoder_layer_pre_norm_gelu_memory_mask",
                 nn.TransformerDecoderLayer(8, 4, dim_feedforward=12, dropout=0.0, activation="gelu",
                                            norm_first=True), (4, 2, 8), (6, 2, 8),
                 {"d_model": 8, "nhead": 4, "ff": 12, "activation": "gelu", "batch_first": 0, "norm_first": 1,
                  "layers": 0, "final_norm": 0}, masks=("tgt_mask", "memory_mask"))
    decoder_case("decoder_2layers_final_norm",
                 nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0), 2,
                                       norm=nn.LayerNorm(8)), (4, 3, 8), (5, 3, 8),
                 {"d_model": 8, "nhead": 2, "ff": 16, "activation": "relu", "batch_first": 0, "norm_first": 0,
                  "layers": 2, "final_norm": 1}, masks=("tgt_mask", "memory_key_padding_mask"))
    decoder_case("transformer_1enc_2dec",
                 nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=2, dim_feedforward=12,
                                dropout=0.0, batch_first=True), (2, 4, 8), (2, 6, 8),
                 {"d_model": 8, "nhead": 2, "ff": 12, "activation": "relu", "batch_first": 1, "norm_first": 0,
                  "layers": 0, "final_norm": 1, "encoder_layers": 1, "decoder_layers": 2},
                 masks=("tgt_mask", "memory_key_padding_mask", "tgt_key_padding_mask"))


def multi_input_case(name, kind, shapes, settings, target=None):
    """A function of several differentiable inputs in0, in1, ... (normalize, cosine_similarity, pairwise_distance,
    kl_div, cosine_embedding_loss, triplet_margin_loss) with an optional fixed "target"; the output and each
    input's gradient. `settings` go to the function as keywords and to the metadata."""
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    inputs = [torch.randn(*shape) for shape in shapes]
    if kind == "normalize":
        inputs[0][0].zero_()  # a zero vector: its norm is clamped at eps, its gradient finite
    if kind == "kl_div":  # log-probabilities against probabilities (or log-probabilities), some exactly 0
        inputs[0] = torch.log_softmax(inputs[0] * 2, dim=-1)
        target = torch.softmax(torch.randn(*shapes[0]) * 2, dim=-1)
        target[0, :2] = 0
        target = target / target.sum(-1, keepdim=True)
        if settings.get("log_target"):
            target = torch.log_softmax(torch.randn(*shapes[0]) * 2, dim=-1)
    for x in inputs:
        x.requires_grad_(True)
    functions = {"normalize": F.normalize, "cosine_similarity": F.cosine_similarity,
                 "pairwise_distance": F.pairwise_distance, "kl_div": F.kl_div,
                 "cosine_embedding_loss": F.cosine_embedding_loss, "triplet_margin_loss": F.triplet_margin_loss}
    args = inputs + ([target] if target is not None else [])
    out = functions[kind](*args, **settings)
    grad_output = torch.randn_like(out)
    (out * grad_output).sum().backward()
    tensors = {"in%d" % i: x.detach() for i, x in enumerate(inputs)}
    tensors.update({"grad_in%d" % i: x.grad for i, x in enumerate(inputs)})
    if target is not None:
        tensors["target"] = target
    tensors.update({"output": out.detach(), "grad_output": grad_output})
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors,
                      dict({k: int(v) if isinstance(v, bool) else v for k, v in settings.items()}, kind=kind,
                           inputs=len(inputs)))


def function_cases():
    multi_input_case("normalize_p2_dim1", "normalize", [(4, 5, 3)], {"p": 2.0, "dim": 1})
    multi_input_case("normalize_p1_last", "normalize", [(3, 6)], {"p": 1.0, "dim": -1, "eps": 1e-3})
    multi_input_case("normalize_p3_dim0", "normalize", [(4, 5)], {"p": 3.0, "dim": 0})
    multi_input_case("cosine_similarity_dim1", "cosine_similarity", [(4, 5), (4, 5)], {"dim": 1})
    multi_input_case("cosine_similarity_broadcast", "cosine_similarity", [(3, 1, 6), (1, 4, 6)], {"dim": -1})
    multi_input_case("pairwise_distance_p2", "pairwise_distance", [(4, 6), (4, 6)], {"p": 2.0})
    multi_input_case("pairwise_distance_p1_keepdim", "pairwise_distance", [(5, 3), (5, 3)],
                     {"p": 1.0, "keepdim": True})
    for reduction in ("batchmean", "sum", "mean", "none"):
        multi_input_case("kl_div_" + reduction, "kl_div", [(4, 5)], {"reduction": reduction}, target=True)
    multi_input_case("kl_div_log_target", "kl_div", [(4, 5)], {"reduction": "batchmean", "log_target": True},
                     target=True)
    multi_input_case("cosine_embedding_loss_margin", "cosine_embedding_loss", [(6, 5), (6, 5)],
                     {"margin": 0.2, "reduction": "mean"}, target=torch.tensor([1., -1., 1., -1., -1., 1.]))
    multi_input_case("cosine_embedding_loss_none", "cosine_embedding_loss", [(4, 3), (4, 3)],
                     {"margin": -0.5, "reduction": "none"}, target=torch.tensor([-1., 1., -1., -1.]))
    multi_input_case("triplet_margin_loss", "triplet_margin_loss", [(5, 4), (5, 4), (5, 4)],
                     {"margin": 1.0, "reduction": "mean"})
    multi_input_case("triplet_margin_loss_p1_swap_none", "triplet_margin_loss", [(5, 4), (5, 4), (5, 4)],
                     {"margin": 0.5, "p": 1.0, "swap": True, "reduction": "none"})


def randomise_affine(module):
    with torch.no_grad():
        module.weight.copy_(torch.rand_like(module.weight) + 0.5)
        module.bias.copy_(torch.randn_like(module.bias))
        if module.running_mean is not None:
            module.running_mean.copy_(torch.randn_like(module.running_mean) * 0.1)
            module.running_var.copy_(torch.rand_like(module.running_var) + 0.5)


def randomise_layernorm(module):
    with torch.no_grad():
        module.weight.copy_(torch.rand_like(module.weight) + 0.5)
        module.bias.copy_(torch.randn_like(module.bias))


def embedding_case(name, num, dim, index_shape, padding_idx=None):
    """Embedding lookups with repeated indices (their gradients add up) and, when given, the padding row."""
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    module = nn.Embedding(num, dim, padding_idx=padding_idx)
    indices = torch.randint(0, num, index_shape)
    indices.view(-1)[0] = indices.view(-1)[1]  # a repeat for sure
    if padding_idx is not None:
        indices.view(-1)[2] = padding_idx % num
    out = module(indices)
    grad_output = torch.randn_like(out)
    (out * grad_output).sum().backward()
    tensors = {"param.weight": module.weight.detach().clone(), "indices": indices, "grad_output": grad_output,
               "output": out.detach(), "grad.weight": module.weight.grad}
    metadata = {"num": num, "dim": dim, "padding_idx": "None" if padding_idx is None else padding_idx}
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors, metadata)


def attention_case(name, batch_first, e, heads, n, l, s, self_attention, causal=False, padding=False,
                   float_mask=False, average=True):
    """nn.MultiheadAttention forward and backward: output, weights, and the gradients of the inputs and parameters."""
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    module = nn.MultiheadAttention(e, heads, batch_first=batch_first)
    with torch.no_grad():
        module.in_proj_bias.copy_(torch.randn_like(module.in_proj_bias) * 0.1)
        module.out_proj.bias.copy_(torch.randn_like(module.out_proj.bias) * 0.1)
    shape = (lambda length: (n, length, e) if batch_first else (length, n, e))
    query = torch.randn(*shape(l), requires_grad=True)
    key = query if self_attention else torch.randn(*shape(s), requires_grad=True)
    value = query if self_attention else torch.randn(*shape(s), requires_grad=True)
    kwargs = {"average_attn_weights": average}
    tensors = {"param." + k: v.clone() for k, v in module.state_dict().items()}
    if causal:
        kwargs["attn_mask"] = torch.triu(torch.ones(l, s, dtype=torch.bool), 1)
    if float_mask:
        kwargs["attn_mask"] = torch.randn(l, s)
        tensors["attn_mask"] = kwargs["attn_mask"]
    if padding:
        mask = torch.zeros(n, s, dtype=torch.bool)
        mask[0, -2:] = True
        mask[1, 0] = True
        kwargs["key_padding_mask"] = mask
        tensors["key_padding_mask"] = mask
    out, weights = module(query, key, value, **kwargs)
    grad_output = torch.randn_like(out)
    (out * grad_output).sum().backward()
    tensors.update({"query": query.detach(), "output": out.detach(), "weights": weights.detach(),
                    "grad_output": grad_output, "grad.query": query.grad})
    if not self_attention:
        tensors.update({"key": key.detach(), "value": value.detach(), "grad.key": key.grad, "grad.value": value.grad})
    for k, p in module.named_parameters():
        tensors["grad.param." + k] = p.grad
    metadata = {"batch_first": int(batch_first), "embed_dim": e, "heads": heads, "self": int(self_attention),
                "causal": int(causal), "average": int(average)}
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors, metadata)


def sdpa_case(name):
    """PyTorch 2's scaled_dot_product_attention, written out (torch 1.13 has none): a bool mask, true = may attend."""
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    q = torch.randn(2, 3, 4, 5, requires_grad=True)
    k = torch.randn(2, 3, 6, 5, requires_grad=True)
    v = torch.randn(2, 3, 6, 7, requires_grad=True)
    allowed = torch.rand(4, 6) > 0.3
    allowed[:, 0] = True  # every query sees a key
    scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(5))
    out = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v
    grad_output = torch.randn_like(out)
    (out * grad_output).sum().backward()
    tensors = {"query": q.detach(), "key": k.detach(), "value": v.detach(), "mask": allowed, "output": out.detach(),
               "grad_output": grad_output, "grad.query": q.grad, "grad.key": k.grad, "grad.value": v.grad}
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors, {})


def loss_case(name, kind, reduction):
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    if kind == "cross_entropy":
        x = torch.randn(7, 5) * 2
        target = torch.randint(0, 5, (7,))
        x.requires_grad_(True)
        loss = F.cross_entropy(x, target, reduction=reduction)
    else:
        x = torch.randn(4, 6)
        target = torch.randn(4, 6)
        x.requires_grad_(True)
        loss = F.mse_loss(x, target, reduction=reduction)
    grad_output = torch.randn_like(loss)
    (loss * grad_output).sum().backward()
    write_safetensors(os.path.join(OUT, name + ".safetensors"),
                      {"input": x.detach(), "target": target, "output": loss.detach(), "grad_output": grad_output,
                       "grad_input": x.grad},
                      {"kind": kind, "reduction": reduction})


def elementwise_loss_case(name, kind, reduction, **options):
    """l1, smooth_l1, huber, bce (on probabilities) and bce_logits, with PyTorch's options."""
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    shape = (5, 4)
    tensors = {}
    if kind == "bce":
        x = torch.sigmoid(torch.randn(*shape) * 2)
        target = torch.rand(*shape)
    elif kind == "bce_logits":
        x = torch.randn(*shape) * 4
        target = (torch.rand(*shape) > 0.5).to(torch.float32)
    else:
        x = torch.randn(*shape) * 2
        target = torch.randn(*shape)
    kw = dict(options)
    if kw.pop("weight", False):
        kw["weight"] = tensors["weight"] = torch.rand(shape[-1]) + 0.5
    if kw.pop("pos_weight", False):
        kw["pos_weight"] = tensors["pos_weight"] = torch.rand(shape[-1]) * 3
    x.requires_grad_(True)
    functions = {"l1": F.l1_loss, "smooth_l1": F.smooth_l1_loss, "huber": F.huber_loss, "bce": F.binary_cross_entropy,
                 "bce_logits": F.binary_cross_entropy_with_logits}
    loss = functions[kind](x, target, reduction=reduction, **kw)
    grad_output = torch.randn_like(loss)
    (loss * grad_output).sum().backward()
    tensors.update({"input": x.detach(), "target": target, "output": loss.detach(), "grad_output": grad_output,
                    "grad_input": x.grad})
    settings = {"kind": kind, "reduction": reduction}
    settings.update({k: v for k, v in options.items() if not isinstance(v, bool)})
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors, settings)


def class_loss_case(name, kind, reduction="mean", weight=False, ignore_index=None, label_smoothing=0.0):
    """cross_entropy / nll_loss with PyTorch's options; a few targets set to ignore_index when it is given."""
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    n, c = 9, 5
    x = torch.randn(n, c) * 2
    target = torch.randint(0, c, (n,))
    if ignore_index is not None:
        target[1] = ignore_index
        target[6] = ignore_index
    w = torch.rand(c) + 0.25 if weight else None
    kw = {"reduction": reduction, "weight": w, "ignore_index": -100 if ignore_index is None else ignore_index}
    x.requires_grad_(True)
    if kind == "cross_entropy":
        loss = F.cross_entropy(x, target, label_smoothing=label_smoothing, **kw)
    else:
        loss = F.nll_loss(x, target, **kw)  # any (N, C) values: nll_loss is linear in them
    grad_output = torch.randn_like(loss)
    (loss * grad_output).sum().backward()
    tensors = {"input": x.detach(), "target": target, "output": loss.detach(), "grad_output": grad_output,
               "grad_input": x.grad}
    if w is not None:
        tensors["weight"] = w
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors,
                      {"kind": kind, "reduction": reduction,
                       "ignore_index": "none" if ignore_index is None else ignore_index,
                       "label_smoothing": label_smoothing})


def softmax_case(name, kind, shape, dim, scale=1.0, keepdim=False):
    """softmax / log_softmax / logsumexp along dim, forward and backward (scale makes the logits large)."""
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    x = (torch.randn(*shape) * scale).requires_grad_(True)
    if kind == "logsumexp":
        out = torch.logsumexp(x, dim, keepdim=keepdim)
    else:
        out = getattr(F, kind)(x, dim)
    grad_output = torch.randn_like(out)
    (out * grad_output).sum().backward()
    write_safetensors(os.path.join(OUT, name + ".safetensors"),
                      {"input": x.detach(), "output": out.detach(), "grad_output": grad_output, "grad_input": x.grad},
                      {"kind": kind, "dim": dim, "keepdim": int(keepdim)})


def cnn():
    # DESIGN.md's `cnn` workload, as the nn.Sequential whose state_dict names ferry matches.
    layers = []
    channels = [3, 32, 64, 128]
    for i in range(3):
        layers += [nn.Conv2d(channels[i], channels[i + 1], 3, padding=1), nn.BatchNorm2d(channels[i + 1]), nn.ReLU(),
                   nn.MaxPool2d(2)]
    layers += [nn.Flatten(), nn.Linear(2048, 10)]
    return nn.Sequential(*layers)


def cnn_case(batch=8, steps=10, lr=0.01, momentum=0.9):
    torch.manual_seed(1234)
    model = cnn()
    x = torch.randn(batch, 3, 32, 32)
    target = torch.randint(0, 10, (batch,))
    tensors = {"input": x, "target": target}
    for key, value in model.state_dict().items():
        tensors["initial." + key] = value.clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    tensors["losses"] = torch.tensor(losses, dtype=torch.float32)
    for key, value in model.state_dict().items():
        tensors["final." + key] = value.clone()
    model.eval()
    with torch.no_grad():
        tensors["eval_logits"] = model(x)
    write_safetensors(os.path.join(OUT, "cnn_sgd.safetensors"), tensors,
                      {"batch": batch, "steps": steps, "lr": lr, "momentum": momentum})


def _sgd(**kw):
    return lambda params: (torch.optim.SGD(params, **kw), dict(kw, kind="sgd"))


def _adam(cls, kind, **kw):
    betas = kw.get("betas", (0.9, 0.999))
    settings = {k: v for k, v in kw.items() if k != "betas"}
    return lambda params: (cls(params, **kw), dict(settings, kind=kind, beta1=betas[0], beta2=betas[1]))


def _plain(cls, kind, **kw):
    return lambda params: (cls(params, **kw), dict(kw, kind=kind))


# (name, make): make(params) -> (the torch optimizer, the settings tests/test_optim.cpp's make_optimizer reads)
OPTIMIZERS = [
    ("sgd_plain", _sgd(lr=0.1)),
    ("sgd_momentum_dampening_wd", _sgd(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd_nesterov_wd", _sgd(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.001)),
    ("sgd_maximize", _sgd(lr=0.1, momentum=0.5, maximize=True)),
    ("adam", _adam(torch.optim.Adam, "adam", lr=0.01)),
    ("adam_wd_amsgrad", _adam(torch.optim.Adam, "adam", lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1,
                              amsgrad=True)),
    ("adamw", _adam(torch.optim.AdamW, "adamw", lr=0.01, weight_decay=0.1)),
    ("rmsprop", _plain(torch.optim.RMSprop, "rmsprop", lr=0.01)),
    ("rmsprop_centered_momentum_wd", _plain(torch.optim.RMSprop, "rmsprop", lr=0.01, alpha=0.9, eps=1e-6,
                                            weight_decay=0.05, momentum=0.8, centered=True)),
    ("rmsprop_maximize", _plain(torch.optim.RMSprop, "rmsprop", lr=0.02, momentum=0.5, maximize=True)),
    ("adagrad", _plain(torch.optim.Adagrad, "adagrad", lr=0.1)),
    ("adagrad_decay_init_wd", _plain(torch.optim.Adagrad, "adagrad", lr=0.1, lr_decay=0.05, weight_decay=0.01,
                                     initial_accumulator_value=0.2, eps=1e-8)),
]


def optim_case(name, make, steps=6, shape=(4, 3)):
    torch.manual_seed(abs(hash(name)) % (2 ** 31))
    p = torch.randn(*shape, requires_grad=True)
    initial = p.detach().clone()
    grads = torch.randn(steps, *shape)
    optimizer, settings = make([p])
    history = []
    for step in range(steps):
        optimizer.zero_grad()
        p.grad = grads[step].clone()
        optimizer.step()
        history.append(p.detach().clone())
    tensors = {"initial": initial, "grads": grads, "params": torch.stack(history)}
    for key, value in optimizer.state_dict()["state"].get(0, {}).items():
        if value is not None:
            tensors["state." + key] = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors, settings)


def optim_edge_cases():
    """Every optimizer of OPTIMIZERS through five steps of gradients at the edge values, one file.

    The parameter is a vector whose elements are independent scenarios (the updates are elementwise): an inf,
    -inf or NaN gradient at one step, gradients whose square overflows (1e20) or underflows (1e-20, 1e-30) float32
    or is subnormal, ones near float32's largest, zero gradients at +-0, and parameters that are inf, NaN, 1e30 or
    near the largest. Case "<name>" holds <name>/initial, <name>/grads (steps, n), <name>/params (steps, n) and
    <name>/state.<key>, its settings in the metadata as "<name>/<setting>"; "<name>.f64" the same in float64, at
    double's edges (1e155 overflows its square, 1e-310 is subnormal, 1.7e308 its largest); tests/test_optim.cpp's
    OptimParityEdgeValues runs them. Then clip_grad_norm_ on two gradients holding the edge values, for each norm
    type: "clip_<case>/grad0", "/grad1", "/total", "/clipped0", "/clipped1".
    """
    inf, nan = math.inf, math.nan
    big, small = 3e38, 1e-40
    #        (initial, gradients of steps 0..4)
    scenarios = [
        (0.5, [0.1, -0.2, 0.3, -0.1, 0.2]),
        (0.0, [0.0, 0.0, 0.0, 0.0, 0.0]),
        (-0.0, [-0.0, -0.0, 0.0, -0.0, -0.0]),
        (1.0, [0.1, inf, 0.1, 0.1, 0.1]),
        (1.0, [-inf, 0.1, 0.1, 0.1, 0.1]),
        (1.0, [0.1, 0.2, nan, 0.1, 0.1]),
        (1.0, [1e20, 1e20, -1e20, 1e20, 1e20]),
        (1.0, [1e-20, 1e-20, -1e-20, 1e-20, 1e-20]),
        (1.0, [1e-30, -1e-30, 1e-30, 1e-30, 1e-30]),
        (1.0, [small, small, -small, small, small]),
        (1.0, [big, big, big, -big, big]),
        (-2.0, [1e10, 1e10, -1e10, 1e10, 1e10]),
        (inf, [0.1, 0.1, 0.1, 0.1, 0.1]),
        (-inf, [0.0, 0.0, 0.0, 0.0, 0.0]),
        (nan, [0.1, 0.1, 0.1, 0.1, 0.1]),
        (1e30, [1.0, 1.0, 1.0, 1.0, 1.0]),
        (big, [-big, -big, -big, -big, -big]),
        (small, [small, small, small, small, small]),
    ]
    # The same scenarios in float64 ("<name>.f64"), each magnitude moved to the same place in double's range.
    in_double = {1e20: 1e155, 1e-20: 1e-160, 1e-30: 1e-200, small: 1e-310, big: 1.7e308, 1e10: 1e80, 1e30: 1e250}

    def to_double(v):
        return math.copysign(in_double.get(abs(v), abs(v)), v) if v == v else v

    tensors, metadata = {}, {"torch": torch.__version__, "note": "see optim_edge_cases() in tools/make_fixtures.py"}
    for dtype, suffix, convert in ((torch.float32, "", lambda v: v), (torch.float64, ".f64", to_double)):
        initial = torch.tensor([convert(s[0]) for s in scenarios], dtype=dtype)
        grads = torch.tensor([[convert(g) for g in s[1]] for s in scenarios], dtype=dtype).t().contiguous()
        for name, make in OPTIMIZERS:
            p = initial.clone().requires_grad_(True)
            optimizer, settings = make([p])
            history = []
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for step in range(grads.size(0)):
                    optimizer.zero_grad()
                    p.grad = grads[step].clone()
                    optimizer.step()
                    history.append(p.detach().clone())
            case = name + suffix
            tensors[case + "/initial"] = initial
            tensors[case + "/grads"] = grads
            tensors[case + "/params"] = torch.stack(history)
            for key, value in optimizer.state_dict()["state"].get(0, {}).items():
                if value is not None:
                    tensors[case + "/state." + key] = (value if isinstance(value, torch.Tensor)
                                                       else torch.tensor(float(value)))
            for key, value in settings.items():
                metadata[case + "/" + key] = value

    # clip_grad_norm_: gradients of two parameters, (3,) and (2, 2), each case with one edge in it.
    grad_sets = {
        "finite": ([3.0, -4.0, 0.5], [[1.0, 2.0], [-0.25, 0.0]]),
        "small": ([1e-3, -2e-3, 0.0], [[0.0, 1e-3], [0.0, 0.0]]),
        "zeros": ([0.0, -0.0, 0.0], [[0.0, 0.0], [0.0, 0.0]]),
        "inf": ([1.0, inf, 0.5], [[1.0, 2.0], [-0.25, 0.0]]),
        "minus_inf": ([1.0, 2.0, 0.5], [[1.0, -inf], [-0.25, 0.0]]),
        "nan": ([1.0, 2.0, nan], [[1.0, 2.0], [-0.25, 0.0]]),
        "huge": ([1e30, -1e30, 1.0], [[1e25, 2.0], [-0.25, 0.0]]),
        "overflowing": ([3e38, 3e38, 1.0], [[1.0, 2.0], [-0.25, 0.0]]),
        "subnormal": ([1e-40, -1e-40, 0.0], [[1e-41, 0.0], [0.0, 0.0]]),
    }
    for norm_type, label in ((2.0, "l2"), (1.0, "l1"), (inf, "linf"), (3.0, "l3")):
        for case, (g0, g1) in grad_sets.items():
            name = "clip_" + label + "_" + case
            a = torch.zeros(3, requires_grad=True)
            b = torch.zeros(2, 2, requires_grad=True)
            a.grad = torch.tensor(g0, dtype=torch.float32)
            b.grad = torch.tensor(g1, dtype=torch.float32)
            tensors[name + "/grad0"] = a.grad.clone()
            tensors[name + "/grad1"] = b.grad.clone()
            tensors[name + "/total"] = torch.nn.utils.clip_grad_norm_([a, b], 1.0, norm_type=norm_type)
            tensors[name + "/clipped0"] = a.grad.clone()
            tensors[name + "/clipped1"] = b.grad.clone()
            metadata[name + "/norm_type"] = norm_type
            metadata[name + "/max_norm"] = 1.0
    write_safetensors(os.path.join(OUT, "optim_edge_values.safetensors"), tensors, metadata)


def half_case():
    """float32 -> float16 and bfloat16 as PyTorch rounds them (tests/test_half.cpp)."""
    g = torch.Generator().manual_seed(16)
    edges = [0.0, -0.0, 1.0, -1.0, 1 / 3, 0.1, 65504.0, 65519.0, 65520.0, 65536.0, -70000.0, 2.0 ** -14,
             2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001, 1.5 * 2.0 ** -24, 2.5 * 2.0 ** -24, 2.0 ** -26, 1e-8,
             3.0e38, 3.3895e38, 3.4e38, float("inf"), float("-inf"), 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11,
             1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -8 + 2.0 ** -20, 2049.0, 2051.0, 257.0, 259.0]
    # Spread over float32's exponents, so that subnormal, normal and overflowing float16s all occur.
    spread = torch.randn(20000, generator=g) * torch.pow(2.0, torch.randint(-40, 40, (20000,), generator=g).float())
    # Exact ties of float16 (11 significant bits, then a 1) and of bfloat16 (8, then a 1).
    whole = torch.randint(1024, 2048, (2000,), generator=g).double()
    scale = torch.pow(2.0, torch.randint(-24, 6, (2000,), generator=g).double())
    ties16 = ((whole + 0.5) * scale).float()
    whole8 = torch.randint(128, 256, (2000,), generator=g).double()
    ties8 = ((whole8 + 0.5) * torch.pow(2.0, torch.randint(-120, 120, (2000,), generator=g).double())).float()
    values = torch.cat([torch.tensor(edges, dtype=torch.float32), spread, ties16, ties8])
    write_safetensors(os.path.join(OUT, "half_conversions.safetensors"),
                      {"float32": values, "float16": values.to(torch.float16), "bfloat16": values.to(torch.bfloat16)},
                      {"torch": torch.__version__})


# The values where functions break: infinities, NaN, signed zeros, a subnormal, magnitudes past exp's range.
EDGE = [-math.inf, -1e30, -100.0, -20.0, -1.0, -0.5, -0.0, 0.0, 1e-40, 0.5, 1.0, 3.0, 20.0, 100.0, 1e30, math.inf,
        math.nan]
EDGE_PAIR = [-math.inf, -1.0, -0.0, 0.0, 1.0, math.inf, math.nan]  # each with each, for the binary functions


def edge_value_cases():
    """Functions at the edge values: every result and its gradient (through a fixed upstream gradient), one file.

    Case "<name>" holds <name>/input (and <name>/other for two operands), <name>/output, <name>/upstream, and the
    gradients <name>/grad (and <name>/grad_other), all float32; "<name>.f64" holds the same case in float64. The
    C++ test (tests/test_nn_parity.cpp, NNParityEdgeValues) runs ferry's function of that name.
    """
    tensors = {}

    def record(name, fn, *inputs):  # in float32 as "<name>", in float64 as "<name>.f64"
        for dtype, case in ((torch.float32, name), (torch.float64, name + ".f64")):
            leaves = [torch.tensor(v, dtype=dtype, requires_grad=True) for v in inputs]
            out = fn(*leaves)
            upstream = (torch.linspace(0.5, 1.5, out.numel(), dtype=dtype).reshape(out.shape) if out.dim()
                        else torch.tensor(0.75, dtype=dtype))
            grads = torch.autograd.grad(out, leaves, upstream, allow_unused=True)
            tensors[case + "/input"] = leaves[0].detach()
            if len(leaves) > 1:
                tensors[case + "/other"] = leaves[1].detach()
            tensors[case + "/output"] = out.detach()
            tensors[case + "/upstream"] = upstream
            for suffix, g, leaf in zip(("/grad", "/grad_other"), grads, leaves):
                tensors[case + suffix] = torch.zeros_like(leaf) if g is None else g

    unary = {
        "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
        "abs": torch.abs, "sign": torch.sign, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
        "erf": torch.erf, "square": torch.square, "sin": torch.sin, "cos": torch.cos, "log1p": torch.log1p,
        "expm1": torch.expm1, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
        "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
        "leaky_relu": lambda x: F.leaky_relu(x, 0.01), "softplus": F.softplus,
        "softplus_beta2_threshold1.5": lambda x: F.softplus(x, 2, 1.5),
        "clamp": lambda x: torch.clamp(x, -1, 1), "clamp_min": lambda x: torch.clamp(x, min=0.5),
        "pow_2": lambda x: torch.pow(x, 2), "pow_3": lambda x: torch.pow(x, 3), "pow_0.5": lambda x: torch.pow(x, 0.5),
        "pow_-1": lambda x: torch.pow(x, -1), "pow_0": lambda x: torch.pow(x, 0),
        "sum": torch.sum, "mean": torch.mean, "max": torch.max, "min": torch.min, "amax": torch.amax,
        "prod": torch.prod, "norm": torch.norm, "std": torch.std, "var": torch.var,
        "logsumexp": lambda x: torch.logsumexp(x, 0), "cumsum": lambda x: torch.cumsum(x, 0),
        "softmax": lambda x: torch.softmax(x, 0), "log_softmax": lambda x: torch.log_softmax(x, 0),
    }
    for name, fn in unary.items():
        record(name, fn, EDGE)
    # Reductions over the finite values and the infinities alone, where NaN does not hide what they do.
    finite_and_inf = [v for v in EDGE if not math.isnan(v)]
    for name in ("sum", "mean", "max", "min", "amax", "prod", "norm", "logsumexp", "softmax", "log_softmax"):
        record(name + "_no_nan", unary[name], finite_and_inf)
    for name, values in (("minus_inf", [-math.inf, -math.inf]), ("plus_inf", [math.inf, 1.0]),
                         ("ties", [2.0, -1.0, 2.0]), ("zeros", [0.0, -0.0, 0.0])):
        for fn_name in ("max", "amax", "logsumexp", "softmax", "log_softmax", "prod", "norm"):
            record(fn_name + "_" + name, unary[fn_name], values)

    binary = {
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
        "minimum": torch.minimum, "pow": torch.pow,
    }
    a = [x for x in EDGE_PAIR for _ in EDGE_PAIR]
    b = [y for _ in EDGE_PAIR for y in EDGE_PAIR]
    for name, fn in binary.items():
        record(name, fn, a, b)
    # pow with a positive finite base and any exponent: the exponent's gradient x^y log x is defined there.
    record("pow_positive_base", torch.pow, [0.5, 2.0, 1e30, 0.5, 2.0, 1e-40, 3.0], [-math.inf, math.inf, 2.0, 0.0,
                                                                                     -0.0, 0.5, math.nan])

    # Elementwise losses (reduction none) against targets across the edges.
    targets = [0.0, 1.0, 0.5, -1.0, 20.0, 0.0, 1.0, 0.0, 1.0, 0.5, 0.0, 1.0, -20.0, 100.0, 0.0, 1.0, 0.0]
    record("mse_loss", lambda x, t: F.mse_loss(x, t, reduction="none"), EDGE, targets)
    record("l1_loss", lambda x, t: F.l1_loss(x, t, reduction="none"), EDGE, targets)
    record("smooth_l1_loss", lambda x, t: F.smooth_l1_loss(x, t, reduction="none"), EDGE, targets)
    record("huber_loss", lambda x, t: F.huber_loss(x, t, reduction="none"), EDGE, targets)
    probabilities = [min(max(abs(t), 0.0), 1.0) for t in targets]
    record("bce_with_logits", lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction="none"), EDGE,
           probabilities)
    record("bce", lambda p, t: F.binary_cross_entropy(p, t, reduction="none"),
           [0.0, 1e-40, 1e-30, 0.25, 0.5, 1.0, 1.0, 0.0, 0.75], [0.0, 0.0, 1.0, 1.0, 0.5, 1.0, 0.0, 1.0, 0.25])
    record("kl_div", lambda x, t: F.kl_div(x, t, reduction="none"), EDGE, probabilities)
    # Row functions (along the last dim of (4, 5) rows): a constant row, a zero row, a row holding inf, one NaN.
    inf, nan = math.inf, math.nan
    rows = [[2.0, 2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0, 0.0], [1.0, -2.0, inf, 0.5, 3.0],
            [1.0, nan, -1.0, 0.25, 2.0]]
    others = [[2.0, 2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0, 0.0], [1.0, 0.0, -1.0, 2.0, 0.5],
              [0.0, 0.0, 0.0, 0.0, 0.0]]
    record("rows_layer_norm", lambda x: F.layer_norm(x, (5,)), rows)
    record("rows_group_norm", lambda x: F.group_norm(x.reshape(2, 2, 5), 1).reshape(4, 5), rows)
    record("rows_normalize", lambda x: F.normalize(x, dim=1), rows)
    record("rows_normalize_p1", lambda x: F.normalize(x, p=1.0, dim=1), rows)
    record("rows_cosine_similarity", lambda x, y: F.cosine_similarity(x, y, dim=1), rows, others)
    record("rows_pairwise_distance", F.pairwise_distance, rows, others)
    record("rows_norm", lambda x: torch.norm(x, dim=1), rows)
    record("rows_std", lambda x: torch.std(x, dim=1), rows)
    record("rows_var_single", lambda x: torch.var(x[:, :1], dim=1), rows)
    record("rows_mean", lambda x: torch.mean(x, dim=1), rows)
    record("rows_amax", lambda x: torch.amax(x, dim=1), rows)
    record("rows_max_dim", lambda x: torch.max(x, dim=1)[0], rows)
    record("rows_logsumexp", lambda x: torch.logsumexp(x, 1), rows)
    record("rows_softmax", lambda x: torch.softmax(x, 1), rows)
    record("rows_log_softmax", lambda x: torch.log_softmax(x, 1), rows)
    record("rows_cross_entropy", lambda x: F.cross_entropy(x, torch.tensor([0, 1, 3, 2]), reduction="none"), rows)
    # Image functions on (1, 2, 4, 4): channel 0 holds a NaN, +inf and -inf, channel 1 is constant.
    image = [[[[1.0, nan, 2.0, 0.5], [0.0, -1.0, inf, 3.0], [-inf, 2.0, 1.0, 1.0], [0.5, 0.5, -inf, -inf]],
              [[3.0] * 4] * 4]]
    record("img_max_pool2d", lambda x: F.max_pool2d(x, 2), image)
    record("img_max_pool2d_s1", lambda x: F.max_pool2d(x, 2, 1), image)
    record("img_avg_pool2d", lambda x: F.avg_pool2d(x, 2), image)
    record("img_adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, (3, 3)), image)
    record("img_adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (3, 3)), image)
    record("img_batch_norm", lambda x: F.batch_norm(x, None, None, training=True), image)
    record("img_upsample_bilinear2d", lambda x: F.interpolate(x, size=(6, 3), mode="bilinear"), image)
    record("img_upsample_bilinear2d_align", lambda x: F.interpolate(x, size=(7, 5), mode="bilinear",
                                                                    align_corners=True), image)
    # Layers with weights (the weight is the second operand, so its gradient is checked too): convolutions through
    # the image's NaN and infinities, the fused BatchNorm + ReLU + pooling block, linear on the rows.
    g = torch.Generator().manual_seed(7)
    conv_weight = torch.randn(3, 2, 3, 3, generator=g)
    conv_weight[0, 0, 1, 1] = 0.0
    record("img_conv2d", lambda x, w: F.conv2d(x, w, padding=1), image, conv_weight.tolist())
    record("img_conv2d_s2", lambda x, w: F.conv2d(x, w, stride=2), image, conv_weight.tolist())
    record("img_conv_transpose2d", lambda x, w: F.conv_transpose2d(x, w, stride=2),
           image, torch.randn(2, 3, 2, 2, generator=g).tolist())
    # Its second channel varies (a constant one is 0 but for rounding that 1 / sqrt(eps) magnifies), with ties in
    # windows, and windows the ReLU makes all 0.
    ties = [[1.0, 1.0, -2.0, 0.5], [1.0, 0.0, -1.0, -3.0], [2.0, 2.0, 0.25, 0.25], [-1.0, 2.0, 0.25, 0.25]]
    record("img_bn_relu_max_pool2d", lambda x: F.max_pool2d(F.relu(F.batch_norm(x, None, None, training=True)), 2),
           [[image[0][0], ties]])
    linear_weight = torch.randn(3, 5, generator=g)
    linear_weight[1, 2] = 0.0
    record("rows_linear", F.linear, rows, linear_weight.tolist())
    record("rows_linear_relu", lambda x, w: F.relu(F.linear(x, w)), rows, linear_weight.tolist())
    record("rows_linear_gelu", lambda x, w: F.gelu(F.linear(x, w)), rows, linear_weight.tolist())
    # Recurrent layers (T 6, N 2, 2 features -> 3 units): sample 0 drives the gates to saturation (1e30, +-inf with
    # the other feature 0, so no inf - inf) and keeps finite outputs; sample 1 meets a NaN at step 1. Their weights
    # are "<case>/param.<name>" (and in float64 under "<case>.f64/").
    steps = [[[1e30, 0.0], [0.5, -0.5]], [[-100.0, 0.5], [nan, 0.0]], [[inf, 0.0], [1.0, 1.0]],
             [[0.0, -inf], [0.25, 0.0]], [[20.0, -20.0], [-1.0, 2.0]], [[0.5, 0.25], [0.0, 0.0]]]
    for cell in ("lstm", "gru"):
        torch.manual_seed(11)
        layer = nn.LSTM(2, 3) if cell == "lstm" else nn.GRU(2, 3)
        record("seq_" + cell, lambda x, layer=layer: layer.to(x.dtype)(x)[0], steps)
        for suffix, dtype in (("", torch.float32), (".f64", torch.float64)):
            for key, value in layer.state_dict().items():
                tensors["seq_" + cell + suffix + "/param." + key] = value.to(dtype).clone()
    write_safetensors(os.path.join(OUT, "edge_values.safetensors"), tensors,
                      {"torch": torch.__version__, "note": "see edge_value_cases() in tools/make_fixtures.py"})


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    # hash() of str is salted per process; fix it so the fixtures are reproducible.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)

    if sys.argv[1:] == ["edge_values"]:  # the two edge-value files alone (the others keep their bits)
        edge_value_cases()
        optim_edge_cases()
        return
    torch.manual_seed(0)
    layer_case("linear", nn.Linear(5, 3), (6, 5), {"in": 5, "out": 3})
    layer_case("linear_3d_nobias", nn.Linear(4, 6, bias=False), (2, 3, 4), {"in": 4, "out": 6, "bias": 0})
    layer_case("conv2d_pad1", nn.Conv2d(3, 4, 3, padding=1), (2, 3, 8, 8),
               {"in": 3, "out": 4, "kh": 3, "kw": 3, "sh": 1, "sw": 1, "ph": 1, "pw": 1, "dh": 1, "dw": 1, "bias": 1})
    layer_case("conv2d_strided_dilated", nn.Conv2d(3, 5, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2)),
               (2, 3, 9, 7),
               {"in": 3, "out": 5, "kh": 3, "kw": 2, "sh": 2, "sw": 1, "ph": 1, "pw": 0, "dh": 1, "dw": 2, "bias": 1})
    layer_case("conv2d_nobias_s2_d2", nn.Conv2d(2, 3, 3, stride=2, padding=2, dilation=2, bias=False), (3, 2, 10, 9),
               {"in": 2, "out": 3, "kh": 3, "kw": 3, "sh": 2, "sw": 2, "ph": 2, "pw": 2, "dh": 2, "dw": 2, "bias": 0})
    layer_case("conv2d_pointwise", nn.Conv2d(6, 4, 1), (3, 6, 5, 4),
               {"in": 6, "out": 4, "kh": 1, "kw": 1, "sh": 1, "sw": 1, "ph": 0, "pw": 0, "dh": 1, "dw": 1, "bias": 1})
    layer_case("conv2d_groups2", nn.Conv2d(4, 6, 3, padding=1, groups=2), (2, 4, 6, 6),
               {"in": 4, "out": 6, "kh": 3, "kw": 3, "sh": 1, "sw": 1, "ph": 1, "pw": 1, "dh": 1, "dw": 1, "bias": 1,
                "groups": 2})
    layer_case("conv2d_depthwise", nn.Conv2d(3, 3, 3, stride=2, groups=3, bias=False), (2, 3, 7, 7),
               {"in": 3, "out": 3, "kh": 3, "kw": 3, "sh": 2, "sw": 2, "ph": 0, "pw": 0, "dh": 1, "dw": 1, "bias": 0,
                "groups": 3})
    layer_case("conv1d_groups2", nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2), (3, 4, 11),
               {"in": 4, "out": 6, "k": 3, "s": 2, "p": 1, "d": 2, "groups": 2, "bias": 1})
    layer_case("convtranspose2d_k3s2p1op1", nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1),
               (2, 3, 4, 5),
               {"in": 3, "out": 4, "kh": 3, "kw": 3, "sh": 2, "sw": 2, "ph": 1, "pw": 1, "oph": 1, "opw": 1, "dh": 1,
                "dw": 1, "bias": 1, "groups": 1})
    layer_case("convtranspose2d_groups2_dilated",
               nn.ConvTranspose2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2, bias=False),
               (2, 4, 5, 4),
               {"in": 4, "out": 6, "kh": 3, "kw": 2, "sh": 2, "sw": 1, "ph": 1, "pw": 0, "oph": 0, "opw": 0, "dh": 1,
                "dw": 2, "bias": 0, "groups": 2})
    # An output padding past its stride (allowed below the dilation): rows no input reaches.
    layer_case("convtranspose2d_op_past_stride", nn.ConvTranspose2d(2, 3, 3, padding=1, output_padding=1, dilation=2),
               (2, 2, 4, 3),
               {"in": 2, "out": 3, "kh": 3, "kw": 3, "sh": 1, "sw": 1, "ph": 1, "pw": 1, "oph": 1, "opw": 1, "dh": 2,
                "dw": 2, "bias": 1, "groups": 1})
    layer_case("convtranspose1d_s2", nn.ConvTranspose1d(4, 2, 4, stride=2, padding=1, groups=2), (3, 4, 6),
               {"in": 4, "out": 2, "k": 4, "s": 2, "p": 1, "op": 0, "d": 1, "groups": 2, "bias": 1})
    rnn_case("lstm_2layer_bidirectional", nn.LSTM(3, 4, num_layers=2, batch_first=True, bidirectional=True),
             (2, 5, 3), {"cell": "lstm"}, with_state=True)
    rnn_case("gru_1layer", nn.GRU(4, 3), (6, 2, 4), {"cell": "gru"}, with_state=True)
    rnn_case("gru_bidirectional_nobias_unbatched", nn.GRU(2, 3, bidirectional=True, bias=False), (4, 2),
             {"cell": "gru"}, with_state=False)
    rnn_case("rnn_relu_2layer", nn.RNN(3, 5, num_layers=2, nonlinearity="relu"), (4, 3, 3), {"cell": "relu"},
             with_state=True)
    rnn_case("rnn_tanh", nn.RNN(2, 3), (5, 2, 2), {"cell": "tanh"}, with_state=False)
    encoder_case("encoder_layer_post_norm_padding",
                 nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True), (3, 5, 8),
                 {"d_model": 8, "nhead": 2, "ff": 16, "activation": "relu", "batch_first": 1, "norm_first": 0,
                  "layers": 0, "final_norm": 0}, padding=True)
    encoder_case("encoder_layer_pre_norm_gelu_causal",
                 nn.TransformerEncoderLayer(8, 4, dim_feedforward=12, dropout=0.0, activation="gelu",
                                            norm_first=True), (6, 2, 8),
                 {"d_model": 8, "nhead": 4, "ff": 12, "activation": "gelu", "batch_first": 0, "norm_first": 1,
                  "layers": 0, "final_norm": 0}, causal=True)
    encoder_case("encoder_2layers_final_norm",
                 nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0), 2,
                                       norm=nn.LayerNorm(8)), (4, 3, 8),
                 {"d_model": 8, "nhead": 2, "ff": 16, "activation": "relu", "batch_first": 0, "norm_first": 0,
                  "layers": 2, "final_norm": 1}, causal=True, padding=True)
    decoder_cases()
    function_cases()
    layer_case("pixel_shuffle_3", nn.PixelShuffle(3), (2, 18, 2, 3), {"r": 3})
    layer_case("pixel_unshuffle_2", nn.PixelUnshuffle(2), (2, 3, 4, 6), {"r": 2})
    layer_case("pixel_shuffle_2_5d", nn.PixelShuffle(2), (2, 3, 8, 2, 3), {"r": 2})
    layer_case("batchnorm2d_train", nn.BatchNorm2d(3), (4, 3, 5, 5), {"features": 3, "dims": 2, "momentum": 0.1},
               setup=randomise_affine, steps=2)
    layer_case("batchnorm2d_eval", nn.BatchNorm2d(3), (4, 3, 5, 5), {"features": 3, "dims": 2, "momentum": 0.1},
               setup=randomise_affine, train=False)
    layer_case("batchnorm1d_train_2d", nn.BatchNorm1d(5), (8, 5), {"features": 5, "dims": 1, "momentum": 0.1},
               setup=randomise_affine)
    layer_case("batchnorm1d_train_3d", nn.BatchNorm1d(3, momentum=0.3), (4, 3, 6),
               {"features": 3, "dims": 1, "momentum": 0.3}, setup=randomise_affine)
    layer_case("batchnorm1d_cumulative", nn.BatchNorm1d(4, momentum=None), (6, 4),
               {"features": 4, "dims": 1, "momentum": "None"}, setup=randomise_affine, steps=3)
    layer_case("relu", nn.ReLU(), (5, 7), {})
    layer_case("maxpool2d_k2", nn.MaxPool2d(2), (2, 3, 8, 8), {"k": 2, "s": 2, "p": 0})
    layer_case("maxpool2d_k3s2p1", nn.MaxPool2d(3, stride=2, padding=1), (2, 3, 9, 9), {"k": 3, "s": 2, "p": 1})
    layer_case("avgpool2d_k2", nn.AvgPool2d(2), (2, 3, 8, 8), {"k": 2, "s": 2, "p": 0})
    layer_case("avgpool2d_k3s2p1", nn.AvgPool2d(3, stride=2, padding=1), (2, 3, 9, 9), {"k": 3, "s": 2, "p": 1})
    layer_case("adaptive_avgpool2d_5x3", nn.AdaptiveAvgPool2d((5, 3)), (2, 3, 9, 7), {"oh": 5, "ow": 3})
    layer_case("adaptive_avgpool2d_1", nn.AdaptiveAvgPool2d(1), (2, 3, 5, 6), {"oh": 1, "ow": 1})
    layer_case("adaptive_avgpool2d_2x4", nn.AdaptiveAvgPool2d((2, 4)), (2, 3, 8, 8), {"oh": 2, "ow": 4})
    layer_case("adaptive_maxpool2d_5x3", nn.AdaptiveMaxPool2d((5, 3)), (2, 3, 9, 7), {"oh": 5, "ow": 3})
    layer_case("adaptive_maxpool2d_3x4_up", nn.AdaptiveMaxPool2d((3, 4)), (2, 2, 2, 3), {"oh": 3, "ow": 4})
    layer_case("adaptive_maxpool2d_2x4", nn.AdaptiveMaxPool2d((2, 4)), (2, 3, 8, 8), {"oh": 2, "ow": 4})
    layer_case("upsample_nearest_2x3", nn.Upsample(scale_factor=(2, 3), mode="nearest"), (2, 3, 4, 5),
               {"sh": 2, "sw": 3})
    layer_case("upsample_bilinear_2x", nn.Upsample(scale_factor=2, mode="bilinear"), (2, 3, 4, 5),
               {"sh": 2, "sw": 2, "mode": "bilinear", "align": 0})
    layer_case("upsample_bilinear_align_3x2", nn.Upsample(scale_factor=(3, 2), mode="bilinear", align_corners=True),
               (1, 2, 3, 4), {"sh": 3, "sw": 2, "mode": "bilinear", "align": 1})
    layer_case("flatten", nn.Flatten(), (2, 3, 4, 5), {})
    layer_case("gelu", nn.GELU(), (5, 7), {"approximate": "none"})
    layer_case("gelu_tanh", nn.GELU(approximate="tanh"), (5, 7), {"approximate": "tanh"})
    layer_case("silu", nn.SiLU(), (5, 7), {})
    layer_case("sigmoid", nn.Sigmoid(), (5, 7), {})
    layer_case("tanh", nn.Tanh(), (5, 7), {})
    layer_case("leaky_relu", nn.LeakyReLU(0.2), (5, 7), {"slope": 0.2})
    layer_case("softplus", nn.Softplus(beta=2.0, threshold=1.5), (5, 7), {"beta": 2.0, "threshold": 1.5})
    layer_case("layernorm_last", nn.LayerNorm(6), (4, 3, 6), {"shape": "6", "eps": 1e-5, "affine": 1},
               setup=randomise_layernorm)
    layer_case("layernorm_last2", nn.LayerNorm((3, 6)), (4, 3, 6), {"shape": "3,6", "eps": 1e-5, "affine": 1},
               setup=randomise_layernorm)
    layer_case("layernorm_noaffine", nn.LayerNorm(5, eps=1e-3, elementwise_affine=False), (7, 5),
               {"shape": "5", "eps": 1e-3, "affine": 0})
    layer_case("groupnorm_2of6", nn.GroupNorm(2, 6), (3, 6, 4, 5), {"groups": 2, "channels": 6, "eps": 1e-5,
                                                                    "affine": 1}, setup=randomise_layernorm)
    layer_case("groupnorm_3of3_noaffine_1d", nn.GroupNorm(3, 3, eps=1e-3, affine=False), (4, 3, 7),
               {"groups": 3, "channels": 3, "eps": 1e-3, "affine": 0})
    embedding_case("embedding", 10, 4, (3, 5))
    embedding_case("embedding_padding", 8, 3, (2, 6), padding_idx=-2)
    attention_case("mha_self_causal", True, 8, 2, 2, 5, 5, self_attention=True, causal=True)
    attention_case("mha_cross_padding", False, 6, 3, 2, 4, 7, self_attention=False, padding=True, float_mask=True,
                   average=False)
    sdpa_case("sdpa_bool_mask")

    for reduction in ("mean", "sum", "none"):
        loss_case("cross_entropy_" + reduction, "cross_entropy", reduction)
        loss_case("mse_" + reduction, "mse", reduction)

    for reduction in ("mean", "sum", "none"):
        class_loss_case("ce_weight_" + reduction, "cross_entropy", reduction, weight=True)
        class_loss_case("ce_smooth_weight_ignore_" + reduction, "cross_entropy", reduction, weight=True,
                        ignore_index=-100, label_smoothing=0.2)
        class_loss_case("nll_weight_ignore_" + reduction, "nll", reduction, weight=True, ignore_index=-100)
    for reduction in ("mean", "sum", "none"):
        elementwise_loss_case("l1_" + reduction, "l1", reduction)
        elementwise_loss_case("bce_weight_" + reduction, "bce", reduction, weight=True)
        elementwise_loss_case("bce_logits_pos_weight_" + reduction, "bce_logits", reduction, weight=True,
                              pos_weight=True)
    elementwise_loss_case("smooth_l1_beta_half_mean", "smooth_l1", "mean", beta=0.5)
    elementwise_loss_case("smooth_l1_beta0_sum", "smooth_l1", "sum", beta=0.0)
    elementwise_loss_case("huber_delta2_mean", "huber", "mean", delta=2.0)
    elementwise_loss_case("huber_none", "huber", "none")
    elementwise_loss_case("bce_mean", "bce", "mean")
    elementwise_loss_case("bce_logits_mean", "bce_logits", "mean")
    class_loss_case("ce_ignore_mean", "cross_entropy", "mean", ignore_index=-100)
    class_loss_case("ce_ignore_class_mean", "cross_entropy", "mean", ignore_index=2)
    class_loss_case("ce_smooth_mean", "cross_entropy", "mean", label_smoothing=0.1)
    class_loss_case("ce_smooth_ignore_sum", "cross_entropy", "sum", ignore_index=-1, label_smoothing=0.3)
    class_loss_case("nll_mean", "nll", "mean")
    softmax_case("softmax_dim1", "softmax", (4, 6), 1)
    softmax_case("softmax_dim0_3d", "softmax", (3, 5, 2), 0)
    softmax_case("softmax_large", "softmax", (3, 7), -1, scale=60.0)
    softmax_case("log_softmax_dim1", "log_softmax", (4, 6), 1)
    softmax_case("log_softmax_last_3d", "log_softmax", (3, 4, 5), -1)
    softmax_case("log_softmax_large", "log_softmax", (3, 7), 1, scale=60.0)
    softmax_case("logsumexp_dim1", "logsumexp", (4, 6), 1)
    softmax_case("logsumexp_dim0_keepdim", "logsumexp", (5, 3), 0, keepdim=True)
    softmax_case("logsumexp_large", "logsumexp", (3, 7), 1, scale=60.0)

    cnn_case()

    for name, make in OPTIMIZERS:
        optim_case(name, make)

    half_case()
    edge_value_cases()
    optim_edge_cases()

    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} fixtures to {os.path.normpath(OUT)} ({total / 1e6:.2f} MB), torch {torch.__version__}")


if __name__ == "__main__":
    main()
