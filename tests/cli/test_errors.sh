#!/usr/bin/env bash
# tests/cli/test_errors.sh — bad input to the ferry command line: one line on stderr, the right exit status (and
# --version, which is not an error); usage: test_errors.sh path/to/ferry
# Not here: what each error says in detail (the unit tests); this checks --device strings, `ferry inspect` on broken files, missing data.
set -u

FERRY="${1:?usage: test_errors.sh path/to/ferry}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
corpus="$root/fuzz/corpus/safetensors"
source "$(dirname "$0")/../script_lib.sh"

# expect_failure STATUS 'TEXT|TEXT' ARGS...: `ferry ARGS` must exit STATUS (any non-zero when STATUS is "nonzero"),
# print exactly one line on stderr, starting "ferry: error:" and holding each |-separated TEXT, and nothing on stdout.
expect_failure() {
  local want="$1" needles="$2"
  shift 2
  local rc=0
  timeout 60 "$FERRY" "$@" >"$scratch/out" 2>"$scratch/err" </dev/null || rc=$?
  local shown
  shown="$(printf '%q ' "$@")"
  if [[ "$want" == nonzero && $rc -eq 0 ]] || [[ "$want" != nonzero && $rc -ne "$want" ]]; then
    fail "ferry $shown exited $rc, expected $want (stderr: $(head -c 400 "$scratch/err"))"
    return
  fi
  if [[ $rc -ge 124 ]]; then
    fail "ferry $shown exited $rc (a timeout or a crash), stderr: $(head -c 400 "$scratch/err")"
    return
  fi
  local lines
  lines="$(wc -l <"$scratch/err")"
  if [[ $lines -ne 1 ]]; then
    fail "ferry $shown printed $lines lines on stderr, expected 1: $(head -c 800 "$scratch/err")"
    return
  fi
  if [[ -s "$scratch/out" ]]; then
    fail "ferry $shown printed on stdout: $(head -c 400 "$scratch/out")"
    return
  fi
  if [[ "$(cat "$scratch/err")" != "ferry: error: "* ]]; then
    fail "ferry $shown: stderr does not start with 'ferry: error: ': $(cat "$scratch/err")"
    return
  fi
  local needle needle_list
  IFS='|' read -ra needle_list <<<"$needles"
  for needle in "${needle_list[@]}"; do
    if ! grep -qF -- "$needle" "$scratch/err"; then
      fail "ferry $shown: stderr lacks '$needle': $(cat "$scratch/err")"
      return
    fi
  done
  echo "ok ($rc): ferry $shown-> $(head -c 160 "$scratch/err")"
}

# --- --device: malformed or absent devices are bad input (exit 2), one line that lists what is present.
for bad in gpu cuda:-1 cuda:x cuda:0:1 "" cpu:1 sim: CUDA " cpu" cuda:99 sim:7 $'cpu\n' $'cuda\n:0' "sim:99999999999"; do
  expect_failure 2 "Devices present: cpu" train --device "$bad" --data "$scratch/no-data"
  expect_failure 2 "Devices present: cpu" eval --checkpoint "$scratch/absent.safetensors" --device "$bad"
done
expect_failure 2 "--graphs" train --graphs sometimes --data "$scratch/no-data"
# Where cuda is asked for and there is none, the error says why (no cuda backend in this build, or no device found).
if ! "$FERRY" devices 2>/dev/null | grep -q "^cuda"; then
  expect_failure 2 "Device 'cuda' is not available|no cuda devices (|cuda" train --device cuda --data "$scratch/no-data"
  expect_failure 2 "Device 'cuda:1' is not available|no cuda devices (|cuda" eval --device cuda:1 --checkpoint "$scratch/absent.safetensors"
fi
# Whole-number options say what they take, not a range up to the largest double.
# A limit of 0 once meant "no limit" and trained on all 60000 images.
for bad in "--epochs -1" "--epochs 0" "--batch 0" "--batch 1.5" "--accumulate 0" "--log-every abc" "--limit-train 0" "--limit-test -5"; do
  read -r option value <<< "$bad"
  expect_failure 2 "$option: expected a whole number >= 1, got $value" train "$option" "$value" --data "$scratch/no-data"
done
# More micro-batches than images per step: refused before the data is read, naming the most it can be.
expect_failure 2 "--accumulate 17 splits each step's 16 images into that many micro-batches: it can be at most 16" \
  train --device cpu --batch 16 --accumulate 17 --data "$scratch/no-data"
expect_failure 2 "--optimizer must be sgd or adamw, got 'adam'" train --optimizer adam --data "$scratch/no-data"
expect_failure 2 "--momentum is SGD's" train --optimizer adamw --momentum 0.5 --data "$scratch/no-data"
expect_failure 2 "--graphs on captures steps on cuda or sim" \
  train --device cpu --optimizer adamw --graphs on --data "$scratch/no-data"
for bad in "--max-steps -2" "--check-replicas-every -1" "--warmup-steps -1"; do
  read -r option value <<< "$bad"
  expect_failure 2 "$option: expected a whole number >= 0, got $value" train "$option" "$value" --data "$scratch/no-data"
done
expect_failure 2 "Devices present: cpu" bench link --device gpu
expect_failure 2 "Devices present: cpu" bench memory --device cuda:42
# Bench counts and times that must be positive are refused as read (a --batch of 0 or -5 ran the workload's own).
expect_failure 2 "--batch: expected a whole number >= 1, got -5" bench golden --batch -5
expect_failure 2 "--batch: expected a whole number >= 1, got 0" bench golden --batch 0
expect_failure 2 "--steps: expected a whole number >= 1, got 0" bench golden --steps 0
expect_failure 2 "--warmup: expected a whole number >= 0, got -1" bench golden --warmup -1
expect_failure 2 "--repeats: expected a whole number >= 1, got -3" bench gemm --device cpu --repeats -3
expect_failure 2 "--max-seconds: expected a number > 0, got 0" bench memory --device cpu --max-seconds 0
expect_failure 2 "--factor: expected a whole number >= 2, got 1" bench allreduce --factor 1
expect_failure 2 "--iters: expected a whole number >= 1, got 0" bench allreduce --iters 0
expect_failure 2 "--timeout: expected a number > 0, got -1" bench allreduce --timeout -1

# --- ferry inspect: every malformed file of the fuzz corpus, a truncated file, a missing file and a folder.
for file in "$corpus"/bad-*; do
  expect_failure 1 "safetensors file '$file'" inspect "$file"
done
head -c 100 "$corpus/valid-every-dtype" >"$scratch/truncated.safetensors"
expect_failure 1 "truncated.safetensors|runs past the end" inspect "$scratch/truncated.safetensors"
size=$(wc -c <"$corpus/valid-every-dtype")
head -c $((size - 3)) "$corpus/valid-every-dtype" >"$scratch/short-data.safetensors"
expect_failure 1 "short-data.safetensors|out of the data buffer" inspect "$scratch/short-data.safetensors"
: >"$scratch/empty.safetensors"
expect_failure 1 "empty.safetensors|is 0 bytes" inspect "$scratch/empty.safetensors"
expect_failure 1 "absent.safetensors|No such file or directory" inspect "$scratch/absent.safetensors"
expect_failure 1 "Is a directory" inspect "$scratch"
# A valid file whose empty tensor [0, 2^62, 4] no tensor can hold (its strides overflow int64).
expect_failure nonzero "overflows int64" inspect "$corpus/edge-empty-tensor-with-huge-dims"
# ... while the valid ones are read.
for file in "$corpus"/valid-*; do
  if "$FERRY" inspect "$file" >"$scratch/out" 2>"$scratch/err"; then
    echo "ok (0): ferry inspect $(basename "$file")"
  else
    fail "ferry inspect $file failed: $(cat "$scratch/err")"
  fi
done

# --- ferry eval on a file that is not a checkpoint, and train with no data: runtime errors (exit 1), one line.
expect_failure 1 "bad-trailing" eval --checkpoint "$corpus/bad-trailing" --device cpu
expect_failure 1 "dataset-fashion-mnist|--data|$scratch/nonexistent" train --device cpu --data "$scratch/nonexistent"
expect_failure 1 "dataset-fashion-mnist" train --device cpu --data /nonexistent

# --- output files whose folder is missing, or that name a folder: exit 2 before any training (the data is not even
# read: --data points nowhere), not after the first epoch or at the end.
expect_failure 2 "--checkpoint $scratch/absent/run.safetensors: the folder '$scratch/absent' does not exist" \
  train --device cpu --data "$scratch/nonexistent" --checkpoint "$scratch/absent/run.safetensors"
expect_failure 2 "--plot $scratch/absent/run.svg: the folder" train --device cpu --data "$scratch/nonexistent" \
  --plot "$scratch/absent/run.svg"
expect_failure 2 "--trace $scratch is a folder" train --device cpu --data "$scratch/nonexistent" --trace "$scratch"
expect_failure 2 "--checkpoint-every needs --checkpoint" train --device cpu --data "$scratch/nonexistent" \
  --checkpoint-every 10
expect_failure 2 "Unknown model 'resnet': expected fmnist or mlp" train --device cpu --model resnet \
  --data "$scratch/nonexistent"

# --- options that could only be ignored or misread: exit 2, one line, before the data is read (--data points nowhere).
mkfifo "$scratch/pipe.safetensors"
expect_failure 2 "is a pipe|give a file name" train --device cpu --data "$scratch/nonexistent" \
  --checkpoint "$scratch/pipe.safetensors"
expect_failure 2 "--checkpoint needs a file name" train --device cpu --data "$scratch/nonexistent" --checkpoint ""
expect_failure 2 "--resume needs a file name" train --device cpu --data "$scratch/nonexistent" --resume ""
expect_failure 2 "--seed: expected a whole number >= 0, got -1" train --device cpu --data "$scratch/nonexistent" --seed -1
expect_failure 2 "--momentum must be a number >= 0" train --device cpu --data "$scratch/nonexistent" --momentum -1
expect_failure 2 "--graphs on captures steps on cuda or sim" train --device cpu --data "$scratch/nonexistent" --graphs on
expect_failure 2 "unknown command 'bogus'|devices, plan, bench, train, eval, inspect" bogus
expect_failure 2 "--graphs on: a data-parallel run (--ddp) steps eagerly" train --device sim --ddp --graphs on \
  --data "$scratch/nonexistent"
# Options only a data-parallel run reads, given without --ddp (they were accepted and ignored).
for bad in "--bucket-mb 3" "--ddp-timeout 5" "--ddp-backend mpi" "--check-replicas-every 2"; do
  read -r option value <<< "$bad"
  expect_failure 2 "$option $value applies to a data-parallel run: it needs --ddp" train --device cpu "$option" "$value" \
    --data "$scratch/nonexistent"
done
# The cpu has no placement to choose (the data is in host memory): one asked for is refused, not ignored.
expect_failure 2 "--placement per-step decides how batches reach an accelerator|--device cpu" train --device cpu \
  --placement per-step --data "$scratch/nonexistent"
expect_failure 2 "--placement prefetch|--device cpu" train --device cpu --placement prefetch --data "$scratch/nonexistent"
# A data folder that cannot be looked into is not "missing" (a symlink loop: ELOOP, for root too).
ln -s loop "$scratch/loop"
expect_failure 1 "cannot read the Fashion-MNIST folder '$scratch/loop'|Too many levels of symbolic links" train \
  --device cpu --data "$scratch/loop"
# Settings in the environment are checked like options: a sim link of "16 GB/s" with a space is understood, one
# that is not a bandwidth is refused (it was read as 16 bytes per second, or as no limit).
FERRY_SIM_LINK=bogus expect_failure 2 "FERRY_SIM_LINK='bogus' is not a bandwidth" devices
FERRY_SIM_DEVICES=two expect_failure 2 "FERRY_SIM_DEVICES='two'" devices
# ... by every command, also those that use no sim device (the settings were read at a sim device's first use only).
FERRY_SIM_LINK=bogus expect_failure 2 "FERRY_SIM_LINK='bogus' is not a bandwidth" train --device cpu \
  --data "$scratch/nonexistent"
FERRY_SIM_DEVICES=two expect_failure 2 "FERRY_SIM_DEVICES='two'" eval --device cpu --checkpoint "$scratch/absent.safetensors"
FERRY_SIM_DEVICES=99 expect_failure 2 "FERRY_SIM_DEVICES='99'" plan golden --speedup 250 --compute 0.1s --transfer 0.7s
FERRY_SIM_LINK=fast expect_failure 2 "FERRY_SIM_LINK='fast'" bench gemm --device cpu --sizes 16 --repeats 1
if FERRY_SIM_LINK="16 GB/s" timeout 20 "$FERRY" devices 2>&1 | grep -q "16.0 GB/s"; then
  ok "FERRY_SIM_LINK='16 GB/s' sets a 16 GB/s link"
else
  fail "FERRY_SIM_LINK='16 GB/s': $(FERRY_SIM_LINK="16 GB/s" timeout 20 "$FERRY" devices 2>&1 | head -c 400)"
fi
# Where OpenMP's threads sleep between loops, ferry splits only larger loops, and says so (src/cpu/parallel_cost.h).
said=$(env -u FERRY_PARALLEL_SCALE OMP_WAIT_POLICY=passive timeout 20 "$FERRY" devices 2>&1)
if grep -q "OMP_WAIT_POLICY=passive): loops below 16x the usual work stay on one thread" <<<"$said"; then
  ok "ferry devices says that sleeping OpenMP threads raise the loops' threshold"
else
  fail "ferry devices under OMP_WAIT_POLICY=passive: $(head -c 600 <<<"$said")"
fi
FERRY_PARALLEL_SCALE=16x expect_failure 2 "FERRY_PARALLEL_SCALE='16x': expected a whole number from 1 to 4096" devices

# --- checkpoints that do not fit: a --model other than the file's is bad usage (2); a file whose settings or tensors
# are not what ferry train writes is damaged (1). One line each, never PyTorch's several-line state-dict error. Then
# a symlink as --checkpoint: the file it names is written, the link stays; and a disk that fills up under --metrics.
data_dir="${FERRY_DATA:-/usr/share/datasets/fashion-mnist}"  # gpu-check points it at its copy
if [[ -f "$data_dir/train-images-idx3-ubyte.gz" ]]; then
  quick=(--device cpu --model mlp --limit-train 64 --limit-test 32 --batch 32 --epochs 1 --data "$data_dir")
  # A switch that is neither on nor off is refused, not read as off (the run would not be the reproducible one).
  FERRY_DETERMINISTIC=maybe expect_failure 2 "FERRY_DETERMINISTIC='maybe'" train "${quick[@]}" --max-steps 1
  # Every FERRY_* switch reads the same words (src/core/environment.h): "off" is off, and a word it cannot read stops.
  if FERRY_FUSED_ACTIVATIONS=off "$FERRY" train "${quick[@]}" --max-steps 1 >"$scratch/out" 2>"$scratch/err"; then
    echo "ok: FERRY_FUSED_ACTIVATIONS=off is a switch ferry reads"
  else
    fail "FERRY_FUSED_ACTIVATIONS=off was refused: $(head -c 400 "$scratch/err")"
  fi
  FERRY_FUSED_ACTIVATIONS=maybe expect_failure 2 "FERRY_FUSED_ACTIVATIONS='maybe' is not a switch" train "${quick[@]}" --max-steps 1
  FERRY_LIBRARY_LAYERS=nope expect_failure 2 "FERRY_LIBRARY_LAYERS='nope' is not a switch" train "${quick[@]}" --max-steps 1
  FERRY_ONEDNN=nah expect_failure 2 "FERRY_ONEDNN='nah' is not a switch" train "${quick[@]}" --max-steps 1
  FERRY_READY_EVENTS=perhaps expect_failure 2 "FERRY_READY_EVENTS='perhaps' is not a switch" train "${quick[@]}" --max-steps 1
  FERRY_PARALLEL_SCALE=0 expect_failure 2 "FERRY_PARALLEL_SCALE='0': expected a whole number from 1 to 4096" train "${quick[@]}" --max-steps 1
  touch "$scratch/real.safetensors"
  ln -s real.safetensors "$scratch/link.safetensors"
  if "$FERRY" train "${quick[@]}" --max-steps 1 --checkpoint "$scratch/link.safetensors" >"$scratch/out" 2>"$scratch/err" &&
     [[ -L "$scratch/link.safetensors" && -s "$scratch/real.safetensors" ]]; then
    echo "ok: --checkpoint through a symlink wrote the file it names and kept the link"
  else
    fail "--checkpoint through a symlink: link $(ls -l "$scratch/link.safetensors"), $(tail -c 300 "$scratch/err")"
  fi
  mlp="$scratch/real.safetensors"
  # A one-step run says "1 step", not "1 steps".
  if grep -q "(1 step on cpu)" "$scratch/out" && grep -q "^Where the time went on cpu (1 step;" "$scratch/out"; then
    ok "one step is \"1 step\""
  else
    fail "one step: $(grep -i "step" "$scratch/out" | head -c 400)"
  fi
  # --resume of a checkpoint already at --max-steps: a note and exit 0, before the data is read (it once trained
  # nothing without a word).
  rc=0
  "$FERRY" train --device cpu --resume "$mlp" --max-steps 1 --data "$scratch/nonexistent" >"$scratch/out" \
    2>"$scratch/err" || rc=$?
  if [[ $rc == 0 && ! -s "$scratch/err" ]] &&
     grep -q "^note: checkpoint $mlp is already at step 1 >= --max-steps 1: nothing to train" "$scratch/out"; then
    ok "--resume at step 1 with --max-steps 1: $(tail -n 1 "$scratch/out")"
  else
    fail "--resume at step 1 with --max-steps 1: exit $rc, $(head -c 300 "$scratch/out") $(head -c 300 "$scratch/err")"
  fi
  rc=0
  "$FERRY" train --device cpu --resume "$mlp" --max-steps 1 --json >"$scratch/out" 2>"$scratch/err" || rc=$?
  if [[ $rc == 0 && ! -s "$scratch/out" ]] && grep -q "^ferry: note: checkpoint .* nothing to train" "$scratch/err"; then
    ok "--resume --json at --max-steps: the note on stderr, stdout empty"
  else
    fail "--resume --json at --max-steps: exit $rc, $(head -c 300 "$scratch/out") $(head -c 300 "$scratch/err")"
  fi
  # Run as one of several mpirun ranks without --ddp: a one-line warning (each rank trains alone).
  rc=0
  OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 "$FERRY" train "${quick[@]}" --max-steps 1 >"$scratch/out" \
    2>"$scratch/err" || rc=$?
  if [[ $rc == 0 && $(wc -l <"$scratch/err") == 1 ]] &&
     grep -q "^ferry: warning: started as one of 2 ranks (mpirun) without --ddp: every rank trains the full model" \
       "$scratch/err"; then
    ok "2 ranks without --ddp: $(cat "$scratch/err")"
  else
    fail "2 ranks without --ddp: exit $rc, stderr $(head -c 400 "$scratch/err")"
  fi
  # --device auto on a machine without cuda: a note says why the cpu was chosen, and that --placement does nothing.
  if ! "$FERRY" devices 2>/dev/null | grep -q "^cuda"; then
    if "$FERRY" train "${quick[@]}" --device auto --placement per-step --max-steps 1 >"$scratch/out" 2>"$scratch/err" &&
       grep -q "^note: --device auto chose cpu: ." "$scratch/out" &&
       grep -q "^note: --placement per-step does nothing on the cpu" "$scratch/out"; then
      ok "$(grep "^note: --device auto" "$scratch/out")"
    else
      fail "--device auto without cuda: $(head -c 400 "$scratch/out") $(head -c 300 "$scratch/err")"
    fi
  fi
  # A loss that blows up (--lr 1e30) is reported as "nan", never glibc's "-nan".
  rc=0
  "$FERRY" train "${quick[@]}" --limit-train 256 --log-every 1 --lr 1e30 --max-steps 8 >"$scratch/out" 2>"$scratch/err" ||
    rc=$?
  if [[ $rc == 1 ]] && grep -q "^ferry: error: The loss became nan at step" "$scratch/err"; then
    ok "a diverging loss: $(cat "$scratch/err")"
  else
    fail "--lr 1e30: exit $rc, $(tail -c 300 "$scratch/err")"
  fi
  # Uncompressed idx files (gunzip's), beside .gz ones.
  mkdir "$scratch/plain"
  for name in train-images-idx3-ubyte train-labels-idx1-ubyte; do gunzip -c "$data_dir/$name.gz" >"$scratch/plain/$name"; done
  ln -s "$data_dir"/t10k-*.gz "$scratch/plain/"
  if "$FERRY" train "${quick[@]}" --max-steps 1 --data "$scratch/plain" >"$scratch/out" 2>"$scratch/err"; then
    ok "uncompressed idx files in --data are read"
  else
    fail "uncompressed idx files: $(tail -c 400 "$scratch/err")"
  fi
  # with_setting KEY VALUE OUT: a copy of the mlp checkpoint with one metadata value changed (safetensors: an 8-byte
  # little-endian header length, the JSON header, the tensors' bytes).
  with_setting() {
    python3 - "$mlp" "$@" <<'PY'
import json, struct, sys
source, key, value, target = sys.argv[1:]
data = open(source, "rb").read()
length = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + length])
header["__metadata__"][key] = value
text = json.dumps(header).encode()
open(target, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + length:])
PY
  }
  expect_failure 2 "--model fmnist cannot resume|holds the mlp model's weights" train --device cpu --resume "$mlp" \
    --model fmnist --max-steps 2
  with_setting model fmnist "$scratch/named-fmnist.safetensors"
  expect_failure 1 "does not fit the model being loaded|the file says 'fmnist'" eval --device cpu \
    --checkpoint "$scratch/named-fmnist.safetensors"
  with_setting batch -5 "$scratch/batch.safetensors"
  expect_failure 1 "its setting 'batch' is '-5', which --batch does not take|damaged" train --device cpu \
    --resume "$scratch/batch.safetensors"
  with_setting model resnet "$scratch/resnet.safetensors"
  expect_failure 1 "its setting 'model' is 'resnet'" eval --device cpu --checkpoint "$scratch/resnet.safetensors"
  if [[ -w /dev/full ]]; then
    rc=0
    "$FERRY" train "${quick[@]}" --max-steps 2 --log-every 1 --metrics /dev/full >"$scratch/out" 2>"$scratch/err" || rc=$?
    if [[ $rc == 1 ]] && grep -q "Writing the metrics to '/dev/full' failed" "$scratch/err"; then
      echo "ok (1): --metrics on a full disk: $(cat "$scratch/err")"
    else
      fail "--metrics /dev/full: exit $rc, $(tail -c 300 "$scratch/err")"
    fi
  fi
else
  echo "SKIP (checkpoint parts): Fashion-MNIST not found in $data_dir (apt-get install dataset-fashion-mnist)"
fi

# --- and the one flag that is not an error: --version, exit 0, the version and what the build holds.
version_rc=0
"$FERRY" --version >"$scratch/out" 2>"$scratch/err" || version_rc=$?
if [[ $version_rc -ne 0 ]] || ! grep -q "^ferry [0-9]" "$scratch/out" || ! grep -q "built with: cpu (OpenBLAS" "$scratch/out"; then
  fail "ferry --version exited $version_rc and printed: $(head -c 400 "$scratch/out") $(head -c 400 "$scratch/err")"
fi

finish test_errors
