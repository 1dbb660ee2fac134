#!/usr/bin/env bash
# gpu_check_rehearsal.sh FERRY — scripts/gpu-check from start to end on the emulated GPU, so that a change to the
# script, or to the JSON of the ferry runs it reads, fails here and not in the GPU machine's few minutes.
#
# Real: the script itself (every stage, its limits, its report code), FERRY's runs on the emulated card — `bench
# golden` for mlp and cnn and the three diagnostic variants, five fmnist epochs, the --deterministic checkpoint
# check (straight vs resumed, byte for byte), the data-parallel runs under mpirun — and the files it writes.
# Stand-ins, on PATH ahead of the real ones: `cmake` (FERRY is already built), `ctest` (the suites run on their
# own), and PyTorch's four scripts, cuda_link_bench, cuda_layer_bench and char_transformer (JSON in their formats,
# with numbers in ANCHORS.md's range: none can run without a card). FERRY runs cut to the emulator's pace (where a
# step of 128 images takes seconds): batch 4 and 2 steps for `bench golden`, 256 training and 100 test images (512
# where a step limit is given, so that the resumed --deterministic run has steps left), step limits divided by 5.
# Not here: any number. Every one printed comes from the emulator or a stand-in; the real ones are the H200's.
set -euo pipefail
FERRY=$(realpath "$1")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "--- gpu-check's output:"; cat "$work/log"; exit 1; }
mkdir -p "$work/bin" "$work/build/tools/ferry" "$work/build/bench" "$work/out"
PYTHON=$(command -v python3)
if command -v mpirun > /dev/null && "$FERRY" bench allreduce --max-bytes 4KiB 2>&1 | grep -q "without MPI"; then
  echo "skipped: mpirun is here but FERRY was built without MPI, so gpu-check's data-parallel runs cannot run"
  exit 77
fi
[[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz || -n "${FERRY_DATA:-}" ]] \
  || { echo "skipped: no Fashion-MNIST (Debian package dataset-fashion-mnist)"; exit 77; }

cat > "$work/bin/cmake" <<'EOF'
#!/usr/bin/env bash
[[ " $* " == *" --build "* ]] || echo "-- CUDA backend: the emulated card (gpu-check rehearsal; nothing configured)"
EOF
cat > "$work/bin/ctest" <<'EOF'
#!/usr/bin/env bash
echo "1/1 Test #1: CudaBackend.RehearsalStandIn ...   Passed    0.01 sec"
echo "100% tests passed, 0 tests failed out of 1 (gpu-check rehearsal: ctest stands in, the suites run on their own)"
EOF
cat > "$work/build/bench/cuda_link_bench" <<'EOF'
#!/usr/bin/env bash
m() { echo "\"$1\": {\"ms\": $2, \"bytes\": $3, \"GBps\": $(awk "BEGIN{print $3/($2*1e-3)/1e9}")}"; }
echo "{\"library\": \"ferry\", \"device\": \"emulated card (rehearsal)\", \"measures\": {$(m h2d_pageable_4MB 0.12 4194304),
 $(m h2d_pageable_256MB 5.6 268435456), $(m h2d_pinned_4MB 0.08 4194304), $(m h2d_pinned_256MB 4.9 268435456),
 $(m d2h_pinned_256MB 4.8 268435456), $(m d2h_pageable_256MB 7.5 268435456), $(m d2d_256MB 0.16 536870912),
 $(m add_3x256MB 0.18 805306368), $(m host_memcpy_256MB_1thread 30 268435456), $(m host_memcpy_256MB_8threads 9 268435456), $(m host_memcpy_256MB_16threads 5 268435456),
 \"gemm_fp32_4096\": {\"ms\": 2.6, \"TFLOPs\": 52.9}, \"gemm_fp32_8192\": {\"ms\": 21, \"TFLOPs\": 52.4}},
 \"staging\": {\"host_to_device\": \"memcpy, 16 threads, 1 MiB chunks\", \"device_to_host\": \"streaming stores, 8 threads, 4 MiB chunks\",
  \"threads_time\": {\"host_to_device\": {\"copies\": 13, \"copying_share\": 0.41, \"waiting_share\": 0.55, \"copying_GBps\": 118.0},
                   \"device_to_host\": {\"copies\": 13, \"copying_share\": 0.83, \"waiting_share\": 0.12, \"copying_GBps\": 44.0}}}}"
EOF
cat > "$work/build/bench/cuda_layer_bench" <<'EOF'
#!/usr/bin/env bash
echo '{"bench": "layers", "workload": "cnn", "batch": 256, "device": "cuda:0", "steps": 20, "stages": [
 {"stage": "0 Conv2d", "forward_ms": 0.05, "backward_ms": 0.12}, {"stage": "1 BatchNorm2d+ReLU+MaxPool2d", "forward_ms": 0.06, "backward_ms": 0.09}],
 "loss_forward_ms": 0.01, "loss_backward_ms": 0.01, "update_ms": 0.02, "forward_ms": 0.11, "backward_ms": 0.21, "step_ms": 0.36}'
EOF
cat > "$work/build/bench/char_transformer" <<'EOF'
#!/usr/bin/env bash
replays=0  # the last --graphs wins, as in the real parser
for arg in "$@"; do case "$arg" in off) replays=0 ;; auto|on) replays=55 ;; esac; done
echo '{"library": "ferry", "model": "gpt", "device": "cuda:0", "steps": 60, "timed_steps": 57, "seconds_per_step": 0.0041, "final_loss": 2.91, "graph_replays": '"$replays"'}'
EOF
# python3: PyTorch's scripts answer with fixed JSON; everything else (the report code) is the real interpreter.
cat > "$work/bin/python3" <<EOF
#!/usr/bin/env bash
case "\${1:-}" in
  */torch_link_bench.py) cat <<'J'
{"library": "torch (rehearsal stand-in)", "device": "emulated card", "measures": {
 "h2d_pageable_4MB": {"ms": 0.6, "GBps": 7.0}, "h2d_pageable_256MB": {"ms": 38, "GBps": 7.1},
 "h2d_pinned_4MB": {"ms": 0.08, "GBps": 52}, "h2d_pinned_256MB": {"ms": 4.9, "GBps": 55},
 "d2h_pinned_256MB": {"ms": 4.8, "GBps": 56}, "d2h_pageable_256MB": {"ms": 40, "GBps": 6.7},
 "d2d_256MB": {"ms": 0.16, "GBps": 3300}, "add_3x256MB": {"ms": 0.19, "GBps": 4200},
 "gemm_fp32_4096": {"ms": 2.6, "TFLOPs": 52.0}, "gemm_fp32_8192": {"ms": 21, "TFLOPs": 52.0}}}
J
  ;;
  */torch_step_bench.py) cat <<'J'
{"library": "PyTorch (rehearsal stand-in)", "device": "emulated card", "workloads": {
 "mlp": {"batch": 512, "resident_s": 0.00106, "item_every_step_s": 0.00129, "peak_device_bytes": 96000000, "peak_device_bytes_warmup": 98000000},
 "cnn": {"batch": 256, "resident_s": 0.00209, "item_every_step_s": 0.00255, "peak_device_bytes": 472000000, "peak_device_bytes_warmup": 900000000}}}
J
  ;;
  */torch_char_transformer.py) cat <<'J'
{"library": "torch (rehearsal stand-in)", "model": "gpt", "device": "cuda", "threads": 2, "steps": 60, "seconds_per_step": 0.0052, "final_loss": 2.95}
J
  ;;
  */torch_fmnist.py) cat <<'J'
{"library": "pytorch (rehearsal stand-in)", "device": "cuda", "epochs": 5, "seconds_per_epoch": 1.18, "test_accuracy": 0.912,
 "history": [{"epoch": 1, "seconds": 1.5, "train_loss": 0.5, "test_accuracy": 0.86}, {"epoch": 2, "seconds": 1.1, "train_loss": 0.35, "test_accuracy": 0.88},
  {"epoch": 3, "seconds": 1.1, "train_loss": 0.3, "test_accuracy": 0.89}, {"epoch": 4, "seconds": 1.1, "train_loss": 0.27, "test_accuracy": 0.905},
  {"epoch": 5, "seconds": 1.1, "train_loss": 0.24, "test_accuracy": 0.912}]}
J
  ;;
  *) exec "$PYTHON" "\$@" ;;
esac
EOF
# ferry, cut to the emulator's pace (see the header).
cat > "$work/build/tools/ferry/ferry" <<EOF
#!/usr/bin/env bash
args=() sub=\$1 what=\${2:-} images=256
while (( \$# )); do
  case \$1 in
    --steps) args+=(--steps 2); shift 2 ;;
    --max-steps) args+=(--max-steps \$(( \$2 / 5 ))); images=512; shift 2 ;;
    --limit-train|--limit-test) shift 2 ;;
    *) args+=("\$1"); shift ;;
  esac
done
case \$sub in
  bench) [[ \$what == golden ]] && args+=(--batch 4 --warmup 1) ;;
  train) args+=(--limit-train \$images --limit-test 100) ;;
esac
exec "$FERRY" "\${args[@]}"
EOF
chmod +x "$work"/bin/* "$work/build/bench/cuda_link_bench" "$work/build/bench/cuda_layer_bench" \
  "$work/build/bench/char_transformer" "$work/build/tools/ferry/ferry"

start=$(date +%s)
rc=0
PATH="$work/bin:$PATH" BUILD="$work/build" OUT="$work/out" GPU_CHECK_SECONDS=3000 GPU_CHECK_TIME_SCALE=8 \
  OMP_NUM_THREADS=1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
  bash "$ROOT/scripts/gpu-check" > "$work/log" 2>&1 || rc=$?
echo "gpu-check on the emulated card: exit status $rc, $(( $(date +%s) - start )) s"

! grep -q "Traceback" "$work/log" || fail "a report block raised"
! grep -q "no result" "$work/log" || fail "a run gave no result"
expect() { grep -qF -- "$1" "$work/log" || fail "no line with: $1"; }
expect "the host's own memcpy of 256 MB (the pageable rows' ceiling): 1thread"
expect "pageable rows: the staging ring chose memcpy, 16 threads, 1 MiB chunks (host->device), streaming stores, 8 threads, 4 MiB chunks (device->host)"
expect "staging threads 16, streaming stores on , 4 MiB chunks: pageable host->device 256 MB"
expect "staging threads 16, streaming stores off, 1 MiB chunks: pageable host->device 256 MB"
expect "    its threads host->device: copying 41 % of the time (118.0 GB/s together), waiting for the link 55 %"
expect "GB/s (copying 83 % at 44.0 GB/s together, waiting 12 %)"
expect "golden mlp: cpu"
expect "golden cnn: cpu"
expect "+ one sync bubble"
expect "cnn resident step without cuDNN (FERRY_CUDNN=0)"
expect "mlp step with the ReLUs unfused"
expect "cnn step with BatchNorm + ReLU unfused"
expect "cnn eager step by stage (GPU time between CUDA events"
expect "GPT step on cuda (examples/char_transformer: 2 blocks of width 64, batch 32 x 64, AdamW, eager, 57 steps timed): ferry 4.100 ms (LayerNorm, GELU and the clip composed, FERRY_LIBRARY_LAYERS=0: 4.100 ms), PyTorch 5.200 ms, ratio 0.79"
expect "GPT step as a CUDA graph (--graphs auto: AdamW capturable, 55 replays): ferry 4.100 ms, 1.00x its eager step, ratio 0.79 against PyTorch's eager step"
expect "    1 BatchNorm2d+ReLU+MaxPool2d"
expect "  mlp step graph: one graph of"
expect "  cnn step graph: one graph of"
expect "GFLOP per step; at this run's fp32 GEMM rate"
expect "MB moved per step (model); at this run's device->device rate"
expect "fmnist on cuda, 5 epochs: epoch 1: ferry"
expect "--deterministic on cuda: 10 + 10 resumed steps write the checkpoint of 20 straight steps, byte for byte"
expect "fmnist on cuda, one epoch with --deterministic"
expect "fmnist on cuda, one epoch with AdamW (capturable, "
# Every goal gets its PASS or FAIL line: on the emulated card issue 3's pass (the stand-ins' numbers), the speed
# goals fail (the emulator runs kernels on host fibers) and the checks that are not about speed pass.
expect "PASS  issue 3: pageable host->device 256 MB >= 40 GB/s"
expect "PASS  issue 3: the test suite passes on the GPU"
expect "issue 5: cnn: the Golden Rule (or, where it misses, the Golden Rule + one sync bubble) predicts the sheet's serial"
expect "issue 5: cnn: ferry's own copy-every-step loop predicted within 10 %"
expect "FAIL  issue 9: mlp step <= 0.6 x PyTorch's"
expect "FAIL  issue 9: cnn step <= 0.6 x PyTorch's"
expect "PASS  issue 9: mlp peak device memory <= PyTorch's"
expect "issue 9: cnn item() every step costs <= 2 %"
expect "FAIL  issue 6: fmnist on cuda, ferry train's defaults: test accuracy >= 0.91"
expect "issue 9: fmnist test accuracy within 0.003 of PyTorch's"
expect "PASS  issue 6: --resume --deterministic on cuda continues bit for bit (10 + 10 steps = 20)"
expect "PASS  issue 5: ferry devices, bench link / memory / gemm and plan speedup --gpu run on cuda"
if command -v mpirun > /dev/null; then
  expect "ddp nccl: 1 rank(s) on cuda:0, backend nccl"
  expect "ddp mpi: 2 rank(s) on cuda:0, backend mpi"
  expect "PASS  issue 7: ferry train --ddp on cuda over NCCL, world size 1: runs, replicas checked"
  expect "PASS  issue 7: ferry train --ddp on cuda 2 ranks sharing the GPU over MPI staging: runs, replicas checked"
fi
grep -qE "^targets: [0-9]+ of 20 met$" "$work/log" || fail "not every goal has its line (20)"
! grep -q "goal(s) not checked" "$work/log" || fail "a report block failed before it checked its goals"
expect "stages: every one ran; targets: one or more missed (FAIL lines above); exit status 1"
grep -E "^(mlp|cnn) +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +<=0.60" "$work/log" | wc -l | grep -qx 2 \
  || fail "the step table does not have its mlp and cnn rows"
[[ $rc == 1 ]] || fail "gpu-check exited $rc, not 1 (speed goals missed on the emulator)"
for file in gpu-check.json runs.json ctest.log; do [[ -s "$work/out/$file" ]] || fail "\$OUT/$file was not written"; done
"$PYTHON" - "$work/out/runs.json" <<'PY' || fail "runs.json lacks a run"
import json, sys
runs = json.load(open(sys.argv[1]))
need = ["golden_mlp.json", "golden_cnn.json", "train_ferry.json", "train_torch.json", "steps_torch.json", "ferry.json",
        "torch.json", "train_ferry_deterministic.json", "train_ferry_adamw.json", "gpt_ferry.json",
        "gpt_ferry_graph.json", "gpt_torch.json"]
missing = [n for n in need if not runs.get(n)]
sys.exit(f"missing or empty: {missing}" if missing else 0)
PY
cat "$work/log"
echo "gpu-check rehearsal: every stage ran and every report line printed (the numbers above are the emulator's and stand-ins')"
