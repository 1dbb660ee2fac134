#!/usr/bin/env bash
# tests/cli/test_convert.sh PATH/TO/FERRY — `ferry convert`: a checkpoint halved to bfloat16 and float16 (every
# floating tensor converted, the integer ones and the metadata kept, half the bytes), scored by `ferry eval`; widened
# back to float32, it scores exactly as the bfloat16 file (the widening is exact); bad dtypes and outputs refused
# with exit 2. Skips where Fashion-MNIST is absent. Not here: the conversions' bits (tests/test_half.cpp).
set -u

FERRY="${1:?usage: test_convert.sh path/to/ferry}"
source "$(dirname "$0")/../script_lib.sh"

data_dir="${FERRY_DATA:-/usr/share/datasets/fashion-mnist}"
if [[ ! -f "$data_dir/t10k-images-idx3-ubyte.gz" ]]; then
  echo "SKIP: Fashion-MNIST not found in $data_dir (apt-get install dataset-fashion-mnist)"
  exit 0
fi
images=2500  # the first 2500 test images score every file (ferry eval --limit-test): the same images each time
json_field() { python3 -c "import json, sys; print(json.load(sys.stdin)[\"$1\"])"; }
accuracy() {
  "$FERRY" eval --checkpoint "$1" --limit-test "$images" --device cpu --data "$data_dir" --json 2>>"$scratch/eval.err" |
    json_field test_accuracy
}

original="$scratch/fmnist.safetensors"
if ! "$FERRY" train --device cpu --max-steps 40 --limit-test "$images" --data "$data_dir" --checkpoint "$original" \
     --json >"$scratch/train.json" 2>"$scratch/train.err"; then
  fail "ferry train: $(tail -c 600 "$scratch/train.err")"
  finish test_convert
fi
float32_accuracy="$(accuracy "$original")"

for dtype in bfloat16 float16; do
  half="$scratch/fmnist.$dtype.safetensors"
  summary="$("$FERRY" convert "$original" --dtype "$dtype" --output "$half" --json 2>"$scratch/convert.err")"
  before="$(echo "$summary" | json_field bytes_before)"
  after="$(echo "$summary" | json_field bytes_after)"
  converted="$(echo "$summary" | json_field converted)"
  tensors="$(echo "$summary" | json_field tensors)"
  if [[ -n "$before" && $((before)) -gt 0 && $((after * 2)) -le $((before + 64)) && $converted -gt 0 && $converted -lt $tensors ]]; then
    ok "$dtype: $converted of $tensors tensors converted (the integer ones kept), $before -> $after bytes"
  else
    fail "$dtype: convert printed '$summary' $(tail -c 400 "$scratch/convert.err")"
  fi
  listing="$("$FERRY" inspect "$half" --json)"
  if echo "$listing" | python3 -c "
import json, sys
d = json.load(sys.stdin)
dtypes = {t['dtype'] for t in d['tensors']}
assert '$dtype' in dtypes and 'float32' not in dtypes, dtypes
assert d['metadata'].get('model') == 'fmnist', d['metadata']"; then
    ok "$dtype: ferry inspect lists $dtype tensors and the checkpoint's metadata"
  else
    fail "$dtype: ferry inspect: $listing"
  fi
  half_accuracy="$(accuracy "$half")"
  widened="$scratch/fmnist.$dtype.float32.safetensors"
  "$FERRY" convert "$half" --dtype float32 --output "$widened" >/dev/null 2>>"$scratch/convert.err"
  widened_accuracy="$(accuracy "$widened")"
  if [[ -n "$half_accuracy" && "$half_accuracy" == "$widened_accuracy" ]] &&
     python3 -c "import sys; sys.exit(abs($half_accuracy - $float32_accuracy) > 0.01)"; then
    ok "$dtype: ferry eval $half_accuracy (float32 $float32_accuracy), widened back: $widened_accuracy"
  else
    fail "$dtype: accuracy '$half_accuracy', widened back '$widened_accuracy', float32 '$float32_accuracy': $(tail -c 400 "$scratch/eval.err")"
  fi
done

expect_refusal() {  # expect_refusal PATTERN ARGS...: exit 2 and an error line matching PATTERN
  local pattern="$1"
  shift
  "$FERRY" convert "$@" >"$scratch/out" 2>"$scratch/err"
  local status=$?
  if [[ $status -eq 2 ]] && grep -Eq "$pattern" "$scratch/err"; then
    ok "convert $*: exit 2, $(head -c 160 "$scratch/err")"
  else
    fail "convert $*: exit $status, $(head -c 300 "$scratch/err")"
  fi
}
expect_refusal "int32 is not floating" "$original" --dtype int32 --output "$scratch/x.safetensors"
expect_refusal "Unknown dtype 'f8'" "$original" --dtype f8 --output "$scratch/x.safetensors"
expect_refusal "does not exist" "$original" --dtype half --output "$scratch/no/such/folder/x.safetensors"

finish test_convert
