#!/usr/bin/env bash
# tests/cli/test_interop.sh PATH/TO/FERRY — a ferry checkpoint in PyTorch (issue 6, point 6): tools/interop_check.py
# loads it into PyTorch's own nn.Sequential with strict names and evaluates the first 2500 of Fashion-MNIST's test
# images (both sides --limit-test, to keep the sanitized run short); the accuracy must be ferry eval's, for the
# fmnist CNN (BatchNorm buffers included) and the mlp. And back: PyTorch's state_dict written as weights-only
# safetensors gives the same accuracy in `ferry eval --model`, and so does its bfloat16 copy (against PyTorch's
# accuracy with the rounded weights). Skips with a reason where Debian's python3-torch is absent. Not here:
# layer-by-layer parity (tests/test_nn_parity.cpp, fixtures).
set -u

FERRY="${1:?usage: test_interop.sh path/to/ferry}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
source "$(dirname "$0")/../script_lib.sh"

python=/usr/bin/python3  # Debian's, where python3-torch installs (not a pyenv or venv one first on PATH)
if ! "$python" -c "import torch, numpy" 2>/dev/null; then
  echo "SKIP: $python cannot import torch and numpy (apt-get install python3-torch)"
  exit 0
fi
data_dir="${FERRY_DATA:-/usr/share/datasets/fashion-mnist}"  # gpu-check points it at its copy
if [[ ! -f "$data_dir/t10k-images-idx3-ubyte.gz" ]]; then
  echo "SKIP: Fashion-MNIST not found in $data_dir (apt-get install dataset-fashion-mnist)"
  exit 0
fi

images=2500  # of the 10000 test images: every accuracy below is over the same first 2500
for model in fmnist mlp; do
  checkpoint="$scratch/$model.safetensors"
  if ! "$FERRY" train --device cpu --model "$model" --max-steps 40 --data "$data_dir" --checkpoint "$checkpoint" --json \
       >"$scratch/$model.train.json" 2>"$scratch/$model.train.err"; then
    fail "$model: ferry train: $(tail -c 600 "$scratch/$model.train.err")"
    continue
  fi
  accuracy="$("$FERRY" eval --checkpoint "$checkpoint" --limit-test "$images" --device cpu --data "$data_dir" --json \
                2>"$scratch/$model.eval.err" |
              "$python" -c 'import json, sys; print(json.load(sys.stdin)["test_accuracy"])')"
  if [[ -z "$accuracy" ]]; then
    fail "$model: ferry eval: $(tail -c 600 "$scratch/$model.eval.err")"
    continue
  fi
  weights="$scratch/$model.torch.safetensors"
  weights_bf16="$scratch/$model.torch.bf16.safetensors"
  if "$python" "$root/tools/interop_check.py" "$checkpoint" --data "$data_dir" --limit-test "$images" \
       --expect "$accuracy" \
       --save-weights "$weights" --save-weights-bf16 "$weights_bf16" \
       >"$scratch/$model.torch.json" 2>"$scratch/$model.torch.err" &&
     grep -q "\"model\": \"$model\"" "$scratch/$model.torch.json"; then
    ok "$model after 40 steps: PyTorch $(head -c 200 "$scratch/$model.torch.json"), ferry eval $accuracy"
  else
    fail "$model: PyTorch's accuracy is not ferry's $accuracy: $(tail -c 600 "$scratch/$model.torch.err") $(head -c 300 "$scratch/$model.torch.json")"
    continue
  fi
  # And back: PyTorch's own state_dict (weights only, no ferry metadata) evaluated by ferry eval --model.
  back="$("$FERRY" eval --checkpoint "$weights" --limit-test "$images" --model "$model" --device cpu \
          --data "$data_dir" --json \
          2>"$scratch/$model.back.err" | "$python" -c 'import json, sys; print(json.load(sys.stdin)["test_accuracy"])')"
  if [[ -n "$back" && "$back" == "$accuracy" ]]; then
    ok "$model: PyTorch's weights-only file in ferry eval --model $model: $back"
  else
    fail "$model: ferry eval of PyTorch's weights gave '$back', not $accuracy: $(tail -c 600 "$scratch/$model.back.err")"
  fi
  # PyTorch's weights in bfloat16 (a half-precision release of the model): ferry widens them exactly as PyTorch's
  # .float() does, so its accuracy is PyTorch's on the rounded weights.
  torch_bf16="$("$python" -c 'import json, sys; print(json.load(sys.stdin)["test_accuracy_bf16"])' <"$scratch/$model.torch.json")"
  back_bf16="$("$FERRY" eval --checkpoint "$weights_bf16" --limit-test "$images" --model "$model" --device cpu \
               --data "$data_dir" --json \
               2>"$scratch/$model.bf16.err" | "$python" -c 'import json, sys; print(json.load(sys.stdin)["test_accuracy"])')"
  if [[ -n "$back_bf16" ]] && "$python" -c "import sys; sys.exit(abs($back_bf16 - $torch_bf16) > 1e-4)"; then
    ok "$model: PyTorch's bfloat16 weights in ferry eval --model $model: $back_bf16 (PyTorch $torch_bf16, float32 $accuracy)"
  else
    fail "$model: ferry eval of PyTorch's bfloat16 weights gave '$back_bf16', PyTorch '$torch_bf16': $(tail -c 600 "$scratch/$model.bf16.err")"
  fi
done
# A weights-only file of one model read as the other: the mismatch is named, one line, exit 1.
if [[ -f "$scratch/mlp.torch.safetensors" ]]; then
  if "$FERRY" eval --checkpoint "$scratch/mlp.torch.safetensors" --device cpu --data "$data_dir" \
       >"$scratch/wrong.out" 2>"$scratch/wrong.err"; then
    fail "mlp weights read as fmnist: ferry eval succeeded"
  elif grep -q "has no ferry metadata, so it was read as the weights of the fmnist model" "$scratch/wrong.err"; then
    ok "mlp weights read as fmnist: $(head -c 200 "$scratch/wrong.err")"
  else
    fail "mlp weights read as fmnist: $(head -c 400 "$scratch/wrong.err")"
  fi
fi

finish test_interop
