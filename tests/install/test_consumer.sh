#!/usr/bin/env bash
# tests/install/test_consumer.sh BUILD_DIR — ferry as another project's dependency (docs/library.md): installs
# BUILD_DIR into a scratch prefix with `cmake --install`, builds examples/ against it with find_package(ferry)
# as an outside project would, then trains with examples/train_mlp, classifies with examples/classify, trains
# examples/char_transformer (a small GPT, then an LSTM char-rnn) on the README for 30 steps each, teaches
# examples/seq2seq's Transformer to reverse digits, and checks that `ferry eval` (the installed one) reads the
# same accuracy from the same checkpoint. Also: bad command lines exit 2 with one line. Skips with a reason where
# Fashion-MNIST is absent.
set -u

build_dir="$(cd "${1:?usage: test_consumer.sh BUILD_DIR}" && pwd)"
root="$(cd "$(dirname "$0")/../.." && pwd)"
source "$(dirname "$0")/../script_lib.sh"

data_dir=/usr/share/datasets/fashion-mnist
if [[ ! -f "$data_dir/train-images-idx3-ubyte.gz" ]]; then
  echo "SKIP: Fashion-MNIST not found in $data_dir (apt-get install dataset-fashion-mnist)"
  exit 0
fi

prefix="$scratch/prefix"
if ! cmake --install "$build_dir" --prefix "$prefix" >"$scratch/install.log" 2>&1; then
  fail "cmake --install: $(tail -c 800 "$scratch/install.log")"
  exit 1
fi
for installed in include/ferry/ferry.h lib/libferry.a lib/cmake/ferry/ferryConfig.cmake \
                 lib/cmake/ferry/ferryConfigVersion.cmake lib/cmake/ferry/ferryTargets.cmake bin/ferry; do
  [[ -f "$prefix/$installed" ]] || fail "cmake --install left out $installed"
done
ok "installed into a scratch prefix: $(find "$prefix/include/ferry" -name '*.h' | wc -l) headers, libferry.a, ferry"

# The examples as an outside project: only the prefix tells CMake where ferry is.
if ! cmake -S "$root/examples" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$prefix" >"$scratch/configure.log" 2>&1; then
  fail "find_package(ferry) from the installed prefix: $(tail -c 1200 "$scratch/configure.log")"
  exit 1
fi
if ! cmake --build "$scratch/build" -j 2 >"$scratch/build.log" 2>&1; then
  fail "building examples/ against the installed ferry: $(grep -m 5 -E 'error|undefined' "$scratch/build.log")"
  exit 1
fi
ok "examples/ configured with find_package(ferry) and built against the installed library"

checkpoint="$scratch/mlp.safetensors"
if "$scratch/build/train_mlp" --device cpu --train-images 2048 --data "$data_dir" --out "$checkpoint" \
     >"$scratch/train.out" 2>"$scratch/train.err" && [[ -s "$checkpoint" ]]; then
  ok "train_mlp: $(grep -m 1 'test accuracy' "$scratch/train.out")"
else
  fail "train_mlp: $(tail -c 600 "$scratch/train.err")"
fi
# The budget held: no host->device bytes inside a step (the data is resident), so the report says 0 B.
grep -q "bytes per step: host->device 0 B" "$scratch/train.out" ||
  fail "train_mlp's report does not show 0 host->device bytes per step: $(grep -m 1 'bytes per step' "$scratch/train.out")"

if "$scratch/build/classify" "$checkpoint" --device cpu --show 3 --data "$data_dir" \
     >"$scratch/classify.out" 2>"$scratch/classify.err"; then
  ours="$(sed -n 's/.*test accuracy \([0-9.]*\) .*/\1/p' "$scratch/classify.out")"
  shown="$(grep -c '^  image ' "$scratch/classify.out")"
  theirs="$("$prefix/bin/ferry" eval --checkpoint "$checkpoint" --device cpu --data "$data_dir" --json 2>&1 |
            sed -n 's/.*"test_accuracy": *\([0-9.]*\).*/\1/p')"
  if [[ -n "$ours" && "$shown" == 3 ]] && awk -v a="$ours" -v b="$theirs" 'BEGIN { exit !(b != "" && a == b) }'; then
    ok "classify and the installed ferry eval agree on the checkpoint: test accuracy $ours"
  else
    fail "classify ($ours, $shown images shown) and ferry eval ($theirs) disagree: $(cat "$scratch/classify.out" "$scratch/classify.err" | tail -c 600)"
  fi
else
  fail "classify: $(tail -c 600 "$scratch/classify.err")"
fi

# char_transformer on a text file (the checkout's README, so nothing else is needed) for 30 steps: the loss falls by
# more than 0.5, no byte crosses to the device inside a step, and it samples on the device, reading the text back
# once (on the cpu the host reads it directly: no sync). train_chars LABEL OUTPUT_NAME [OPTION ...]
train_chars() {
  local label="$1" out="$scratch/$2.out" err="$scratch/$2.err"
  shift 2
  if ! "$scratch/build/char_transformer" --text "$root/README.md" --device cpu --steps 30 --log-every 10 \
       --sample 40 "$@" >"$out" 2>"$err"; then
    fail "$label: $(tail -c 600 "$err")"
    return
  fi
  local first last
  first="$(sed -n 's/^  step 1  loss \([0-9.]*\).*/\1/p' "$out")"
  last="$(sed -n 's/^  step 30  loss \([0-9.]*\).*/\1/p' "$out")"
  if awk -v a="$first" -v b="$last" 'BEGIN { exit !(a != "" && b != "" && b < a - 0.5) }' &&
     grep -Eq "^sample \(40 characters, 0 host syncs\):" "$out" &&
     grep -q "bytes per step: host->device 0 B" "$out"; then
    ok "$label: loss $first -> $last in 30 steps, 0 bytes to the device per step, 40 characters sampled with no sync"
  else
    fail "$label: loss '$first' -> '$last': $(head -c 800 "$out")"
  fi
}
train_chars "char_transformer" gpt                             # a small GPT
train_chars "char_transformer --model lstm" lstm --model lstm --context 32 --lr 1e-2  # a char-rnn: BPTT over 32 steps

# seq2seq: an encoder-decoder Transformer learns to reverse 6 digits in 150 steps; greedy decoding of 100 new
# sequences must reverse at least 90 % of them.
if "$scratch/build/seq2seq" --device cpu --steps 150 --length 6 --log-every 50 --eval 100 \
     >"$scratch/seq2seq.out" 2>"$scratch/seq2seq.err"; then
  right="$(sed -n 's/^greedy decoding of 100 new sequences: reversed right \([0-9.]*\) of sequences.*/\1/p' \
           "$scratch/seq2seq.out")"
  if awk -v r="$right" 'BEGIN { exit !(r != "" && r >= 0.9) }'; then
    ok "seq2seq: nn::Transformer reverses $right of 100 new 6-digit sequences after 150 steps"
  else
    fail "seq2seq: reversed '$right' of the sequences: $(tail -c 800 "$scratch/seq2seq.out")"
  fi
else
  fail "seq2seq: $(tail -c 600 "$scratch/seq2seq.err")"
fi

# Bad command lines: status 2 and one line on stderr.
expect_usage_error() {
  local what="$1"
  shift
  "$@" >"$scratch/bad.out" 2>"$scratch/bad.err"
  local status=$?
  if [[ $status == 2 && $(wc -l <"$scratch/bad.err") == 1 ]]; then
    ok "$what: exit 2, $(cat "$scratch/bad.err")"
  else
    fail "$what: exit $status, stderr: $(head -c 400 "$scratch/bad.err")"
  fi
}
expect_usage_error "train_mlp --epochs 0" "$scratch/build/train_mlp" --epochs 0
expect_usage_error "classify without a checkpoint" "$scratch/build/classify"
expect_usage_error "char_transformer --dim 10 --heads 3" "$scratch/build/char_transformer" --dim 10 --heads 3
expect_usage_error "char_transformer --model rnn" "$scratch/build/char_transformer" --model rnn
expect_usage_error "seq2seq --length 1" "$scratch/build/seq2seq" --length 1
expect_usage_error "classify --device cuda:7" "$scratch/build/classify" "$checkpoint" --device cuda:7

finish test_consumer
