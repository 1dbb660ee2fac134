#!/usr/bin/env bash
# train_on_emulated_gpu.sh FERRY — `ferry train` end to end on the emulated GPU (docs/emulated-gpu.md): the cuda
# paths of the training loop — the step graph (on by default on cuda) and the eager step, each placement, a
# checkpoint written from device memory and evaluated again — each checked against the same run on the cpu.
# Small runs: every kernel runs on host fibers here.
set -euo pipefail
FERRY=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
json_field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
# |a - b| <= 0.02: the cuda kernels add in another order than the cpu's, so a test image near a decision
# boundary may go either way; a broken kernel or a copy that arrives late moves the accuracy far more.
close() { python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - float(sys.argv[2])) <= 0.02 else 1)" "$1" "$2"; }

"$FERRY" devices | grep -q "cuda:0" || fail "the emulated card is not listed by ferry devices"
common=(train --batch 32 --limit-train 320 --limit-test 200 --log-every 5 --epochs 1 --json)

cpu_acc=$("$FERRY" "${common[@]}" --device cpu --checkpoint "$work/cpu.safetensors" | json_field test_accuracy)
echo "cpu: test accuracy $cpu_acc"

# The default on cuda: data resident on the device, the step captured as a graph after two eager steps.
out=$("$FERRY" "${common[@]}" --device cuda --checkpoint "$work/run.safetensors")
[[ $(json_field device <<<"$out") == cuda:0 ]] || fail "trained on $(json_field device <<<"$out"), not cuda:0"
acc=$(json_field test_accuracy <<<"$out")
close "$acc" "$cpu_acc" || fail "cuda (resident, graphs): test accuracy $acc, cpu $cpu_acc"
echo "cuda, resident, step graph: test accuracy $acc"

# Eager steps with a copy every step, and prefetched batches: the copies and the graph change nothing but time.
for variant in "--graphs off --placement per-step" "--placement prefetch"; do
  # shellcheck disable=SC2086
  other=$("$FERRY" "${common[@]}" --device cuda $variant | json_field test_accuracy)
  close "$other" "$cpu_acc" || fail "cuda $variant: test accuracy $other, cpu $cpu_acc"
  echo "cuda $variant: test accuracy $other"
done

# The checkpoint written from device memory holds the trained weights: on the cpu, over the 10000 test images,
# it scores as the cpu run's own checkpoint does.
eval_cuda=$("$FERRY" eval --checkpoint "$work/run.safetensors" --device cpu --json | json_field test_accuracy)
eval_cpu=$("$FERRY" eval --checkpoint "$work/cpu.safetensors" --device cpu --json | json_field test_accuracy)
close "$eval_cuda" "$eval_cpu" || fail "the cuda run's checkpoint scores $eval_cuda, the cpu run's $eval_cpu"
echo "eval (cpu, 10000 images): cuda run's checkpoint $eval_cuda, cpu run's $eval_cpu"
# Data-parallel cuda ranks that share one card (the same PCI bus id): gradients staged through pinned host
# memory and all-reduced over MPI; after 4 steps the same parameters as one cuda process with the whole batch.
if command -v mpirun >/dev/null && ! "$FERRY" bench allreduce --max-bytes 4KiB 2>&1 | grep -q "without MPI"; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMPI_MCA_btl=self,vader,tcp \
    OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
  mlp=(train --model mlp --device cuda --batch 64 --max-steps 4 --limit-train 512 --limit-test 64 --log-every 2 --json)
  "$FERRY" "${mlp[@]}" --checkpoint "$work/mlp_single.safetensors" >/dev/null || fail "one cuda process (mlp)"
  mpirun -np 2 --oversubscribe --bind-to none "$FERRY" "${mlp[@]}" --ddp --ddp-backend mpi --check-replicas-every 1 \
    --checkpoint "$work/mlp_ddp.safetensors" >"$work/ddp.json" || fail "mpirun -np 2 --ddp on the emulated card"
  grep -q '"comm_backend":"mpi"' "$work/ddp.json" || fail "DDP did not use MPI staging: $(head -c 300 "$work/ddp.json")"
  python3 "$(dirname "$0")/../cli/compare_safetensors.py" "$work/mlp_ddp.safetensors" "$work/mlp_single.safetensors" ||
    fail "2 cuda ranks over MPI staging differ from one cuda process"
  echo "DDP: 2 cuda ranks on one card over MPI staging match one process"
else
  echo "skip (DDP): no MPI in this build"
fi
echo "PASS"
