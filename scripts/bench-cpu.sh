#!/usr/bin/env bash
# bench-cpu.sh — ferry against PyTorch on this machine's cpu, in one run: installs the peers (Debian's
# libtorch-dev and python3-torch, 1.13) if missing, builds, then
#   1. bench/cpu_step_bench: one training step of the mlp and cnn workloads, ferry and libtorch alternating
#      in one process on the same thread count (issue 4's ratios);
#   2. the same program's --workload conv: one convolution's forward and backward (conv2d, conv_transpose2d,
#      conv1d, conv_transpose1d) in ferry on oneDNN, in ferry on im2col + OpenBLAS, and in libtorch;
#   3. the fmnist epoch: `ferry train --json` and bench/torch_fmnist.py, same model, data, settings and loop
#      (issue 6's ratio), each on the same thread count.
# Prints a short table last; paste it into docs/BENCHMARKS.md. Run it on a quiet machine: other load lands on
# whichever library runs at that moment.
#   FERRY_BENCH_THREADS=<n> (default: every core)  FERRY_BENCH_EPOCHS=1  FERRY_BENCH_STEPS=20
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh libtorch-dev python3-torch
build=${FERRY_BUILD_DIR:-build}
threads=${FERRY_BENCH_THREADS:-$(nproc)}
epochs=${FERRY_BENCH_EPOCHS:-1}
export OMP_NUM_THREADS=$threads

# which OpenBLAS kernels the GEMMs run on (OPENBLAS_CORETYPE, where the machine sets it, is left as it is)
blas=$("$build/tools/ferry/ferry" devices | sed -n 's/^ *libraries: //p' | head -1)
echo "== cpu BLAS: $blas"
echo "== step benchmark (bench/cpu_step_bench, $threads threads)"
step_table=$("$build/bench/cpu_step_bench" --threads "$threads" --warmup 3 --steps "${FERRY_BENCH_STEPS:-20}" --breakdown)
echo "$step_table"
echo "== convolutions (bench/cpu_step_bench --workload conv)"
conv_table=$("$build/bench/cpu_step_bench" --threads "$threads" --warmup 3 --steps 15 --workload conv)
echo "$conv_table"

echo "== fmnist epoch ($epochs epoch(s), $threads threads): ferry train"
ferry_json=$("$build/tools/ferry/ferry" train --device cpu --epochs "$epochs" --json)
echo "== fmnist epoch: bench/torch_fmnist.py"
torch_json=$(/usr/bin/python3 bench/torch_fmnist.py --device cpu --threads "$threads" --epochs "$epochs")

echo
echo "ferry vs PyTorch on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $threads threads, $(date -u +%F)"
echo "cpu BLAS: $blas"
echo "$step_table" | sed -n '/^workload/,$p' | grep -v '^ '
echo "$conv_table" | sed -n '/^convolution/,$p'
python3 - "$ferry_json" "$torch_json" <<'PY'
import json, sys
f, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"fmnist epoch (batch 128, {f['epochs']} epoch(s)): ferry {f['seconds_per_epoch']:.1f} s, "
      f"PyTorch {t['seconds_per_epoch']:.1f} s, ratio {f['seconds_per_epoch'] / t['seconds_per_epoch']:.2f} (goal <= 0.8); "
      f"test accuracy ferry {f['test_accuracy']:.4f}, PyTorch {t['test_accuracy']:.4f}")
PY
