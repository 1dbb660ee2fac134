#!/usr/bin/env bash
# tests/cli/test_ddp.sh PATH/TO/FERRY — mpirun -np 2 and -np 4: parity with one process, replicas, the B/N error, the bench,
# ranks started with different options, ranks that die or stall. Not here: single-process parts (tests/test_dist.cpp). Under 3 min on 2 cores; skips with a reason.
set -u

FERRY="${1:?usage: test_ddp.sh path/to/ferry}"
FERRY="$(cd "$(dirname "$FERRY")" && pwd)/$(basename "$FERRY")"
source "$(dirname "$0")/../script_lib.sh"
background_pid=""
on_exit '[[ -n "$background_pid" ]] && kill "$background_pid" 2>/dev/null'  # mpirun stops its ranks on SIGTERM

if ! command -v mpirun >/dev/null; then
  echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
  exit 0
fi
# CI runs as root; Open MPI refuses that unless told. One thread per rank: ranks share the cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# Ranks of this test stay on this host: shared memory and loopback only.
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
mpi() { local n=$1; shift; mpirun -np "$n" --oversubscribe --bind-to none "$@"; }

if "$FERRY" bench allreduce --max-bytes 4KiB 2>&1 | grep -q "without MPI"; then
  echo "SKIP: this ferry was built without MPI"
  exit 0
fi

# --- ferry bench allreduce: every size checked, raw MPI timed alongside ---------------------------------
for n in 2 3 4; do  # 2 and 4: recursive doubling below 64 KiB; 3: MPI's own there; the ring above
  if mpi "$n" "$FERRY" bench allreduce --min-bytes 1KiB --max-bytes 4MiB --factor 8 --repeats 1 --warmup 1 \
       --max-seconds 0.05 --json >"$scratch/bench$n.json" 2>"$scratch/bench$n.err" &&
     python3 - "$scratch/bench$n.json" "$n" <<'PY'; then
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, f"expected one JSON line from rank 0 alone, got {len(lines)}"
j = json.loads(lines[0])
assert j["world_size"] == int(sys.argv[2]) and j["correct"], j
assert [p["bytes"] for p in j["points"]] == [1024, 8192, 65536, 524288, 4194304], j["points"]
assert all(p["busbw"] > 0 and p["raw_busbw"] > 0 and p["wrong"] == 0 for p in j["points"]), j["points"]
print(f"  np {sys.argv[2]}: busbw/raw at 4 MB = {j['points'][-1]['ratio']:.2f}")
PY
    ok "mpirun -np $n ferry bench allreduce: every result correct, one report"
  else
    fail "mpirun -np $n ferry bench allreduce: $(tail -c 600 "$scratch/bench$n.err") $(head -c 600 "$scratch/bench$n.json")"
  fi
done

# bfloat16 beside float32 (the same elements), both ferry's: every sum checked
if mpi 2 "$FERRY" bench allreduce --dtype bfloat16 --min-bytes 1KiB --max-bytes 4MiB --factor 8 --repeats 1 \
     --warmup 1 --max-seconds 0.05 --json >"$scratch/bench_bf16.json" 2>"$scratch/bench_bf16.err" &&
   python3 -c '
import json, sys
j = json.loads(open(sys.argv[1]).read())
assert j["dtype"] == "bfloat16" and j["raw"] == "ferry float32" and j["correct"], j
assert [p["count"] for p in j["points"]] == [512, 4096, 32768, 262144, 2097152], j["points"]
ratio = j["points"][-1]["ratio"]
print(f"  bfloat16 vs float32, same elements, 4 MB: {ratio:.2f}x")
' "$scratch/bench_bf16.json"; then
  ok "mpirun -np 2 ferry bench allreduce --dtype bfloat16: every 16-bit sum correct, float32's beside it"
else
  fail "bench allreduce --dtype bfloat16: $(tail -c 600 "$scratch/bench_bf16.err")" \
       "$(head -c 600 "$scratch/bench_bf16.json")"
fi

data_dir="${FERRY_DATA:-/usr/share/datasets/fashion-mnist}"  # gpu-check points it at its copy
if [[ ! -f "$data_dir/train-images-idx3-ubyte.gz" ]]; then
  echo "SKIP (training parts): Fashion-MNIST not found in $data_dir (apt-get install dataset-fashion-mnist)"
  finish test_ddp
fi

# --- parity: N ranks with global batch B = one process with batch B, after k steps --------------------
common=(train --model mlp --device cpu --batch 64 --max-steps 4 --limit-train 512 --limit-test 64 --log-every 2
        --json --data "$data_dir")
if "$FERRY" "${common[@]}" --checkpoint "$scratch/single.safetensors" >"$scratch/single.json" 2>"$scratch/single.err"; then
  ok "one process: 4 steps of the mlp, batch 64"
else
  fail "single-process run: $(tail -c 600 "$scratch/single.err")"
fi

# compare A B [BOUND]: ||a - b|| / ||b|| <= BOUND (1e-5) for every float32 tensor
compare() { python3 "$(dirname "${BASH_SOURCE[0]}")/compare_safetensors.py" "$@"; }

for n in 2 4; do
  if mpi "$n" "$FERRY" "${common[@]}" --ddp --check-replicas-every 1 --checkpoint "$scratch/ddp$n.safetensors" \
       >"$scratch/ddp$n.json" 2>"$scratch/ddp$n.err"; then
    if python3 -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, f"{len(lines)} lines: rank 0 alone prints"
j = json.loads(lines[0])
assert j["world_size"] == int(sys.argv[2]) and j["steps"] == 4 and j["replica_checks"] >= 5, j
assert j["gradient_bytes_per_step"] == 4 * j["parameters"], j
assert j["collective_bytes"] >= 4 * j["gradient_bytes_per_step"], j
' "$scratch/ddp$n.json" "$n" && compare "$scratch/ddp$n.safetensors" "$scratch/single.safetensors"; then
      ok "mpirun -np $n --ddp: same parameters as one process after 4 steps; replicas identical at every step"
    else
      fail "np $n parity: $(head -c 600 "$scratch/ddp$n.json")"
    fi
  else
    fail "mpirun -np $n ferry train --ddp: $(tail -c 800 "$scratch/ddp$n.err")"
  fi
done

# --- --allreduce-dtype bfloat16: half the gradient bytes on the wire, each averaged gradient rounded; after 4 steps the
# parameters (and momentum) stay within 1 % of one process's, and the replicas identical -----------------------------
if mpi 2 "$FERRY" "${common[@]}" --ddp --allreduce-dtype bfloat16 --check-replicas-every 1 \
     --checkpoint "$scratch/bf16.safetensors" >"$scratch/bf16.json" 2>"$scratch/bf16.err" &&
   python3 -c '
import json, sys
b, d = (json.loads(open(f).read()) for f in sys.argv[1:3])
assert b["allreduce_dtype"] == "bfloat16" and b["gradient_bytes_per_step"] == 2 * b["parameters"], b
assert b["collectives"] == d["collectives"] and b["collective_bytes"] < d["collective_bytes"], (b, d)
assert b["replica_checks"] >= 5, b
' "$scratch/bf16.json" "$scratch/ddp2.json" &&
   compare "$scratch/bf16.safetensors" "$scratch/single.safetensors" 1e-2; then
  ok "mpirun -np 2 --ddp --allreduce-dtype bfloat16: 2 bytes a gradient, replicas identical, within 1 % of one process"
else
  fail "--allreduce-dtype bfloat16: $(tail -c 600 "$scratch/bf16.err") $(head -c 600 "$scratch/bf16.json")"
fi

# --- --accumulate 4 under --ddp: each rank's 32 images in 4 micro-batches, the first 3 backward passes under no_sync:
# the one process's parameters still, and the same collectives as the run without accumulation ---------------------
if mpi 2 "$FERRY" "${common[@]}" --ddp --accumulate 4 --check-replicas-every 1 --checkpoint "$scratch/acc.safetensors" \
     >"$scratch/acc.json" 2>"$scratch/acc.err" &&
   python3 -c '
import json, sys
a, d = (json.loads(open(f).read()) for f in sys.argv[1:3])
assert a["accumulate"] == 4 and a["steps"] == 4, a
assert a["collectives"] == d["collectives"] and a["collective_bytes"] == d["collective_bytes"], (a, d)
' "$scratch/acc.json" "$scratch/ddp2.json" && compare "$scratch/acc.safetensors" "$scratch/single.safetensors"; then
  ok "mpirun -np 2 --ddp --accumulate 4: one process's parameters, no more all-reduces than without accumulation"
else
  fail "--ddp --accumulate 4: $(tail -c 600 "$scratch/acc.err") $(head -c 600 "$scratch/acc.json")"
fi

# --- the fmnist CNN (BatchNorm buffers follow rank 0), rank 0 alone prints ----------------------------------
if mpi 2 "$FERRY" train --ddp --device cpu --batch 32 --epochs 1 --limit-train 256 --limit-test 100 --log-every 4 \
     --data "$data_dir" >"$scratch/cnn.out" 2>"$scratch/cnn.err" &&
   [[ $(grep -c "^ferry train:" "$scratch/cnn.out") -eq 1 ]] && grep -q "final test accuracy" "$scratch/cnn.out" &&
   grep -q "Data-parallel over 2 ranks" "$scratch/cnn.out" && grep -q "Exercise 4.1" "$scratch/cnn.out"; then
  ok "mpirun -np 2 ferry train --ddp (fmnist CNN): one report, the all-reduce bytes against Exercise 4.1"
else
  fail "fmnist --ddp: $(tail -c 600 "$scratch/cnn.err") $(tail -c 600 "$scratch/cnn.out")"
fi

# --- a stop request on one rank (SIGTERM to rank 1 alone): the ranks agree at the next log step, all stop after the
# same step, rank 0 writes the checkpoint there, and --resume under mpirun goes on as one unbroken run would -------
stop_args=(train --model mlp --device cpu --batch 64 --limit-train 1024 --limit-test 64 --epochs 100 --log-every 2
           --data "$data_dir")
mpi 2 "$FERRY" "${stop_args[@]}" --ddp --metrics "$scratch/stop.jsonl" --checkpoint "$scratch/stop.safetensors" \
  >"$scratch/stop.out" 2>"$scratch/stop.err" &
background_pid=$!
rank1=""
for _ in $(seq 600); do  # up to 30 s for rank 1 to start and rank 0 to log a step
  # Rank 1 of this job only: a child of this job's mpirun (other tests may run ranks of their own meanwhile).
  for launcher in "$background_pid" $(pgrep -P "$background_pid" 2>/dev/null); do  # mpirun, or the subshell above it
    for pid in $(pgrep -P "$launcher" 2>/dev/null); do
      tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && rank1=$pid
    done
  done
  [[ -n "$rank1" ]] && grep -q '"kind":"step"' "$scratch/stop.jsonl" 2>/dev/null && break
  sleep 0.05
done
rc=0
[[ -n "$rank1" ]] && kill -TERM "$rank1"
wait "$background_pid" || rc=$?
background_pid=""
# The ranks agree at a log step ("after N steps, in epoch ...") or, when the signal lands after an epoch's last log
# step, at its end ("at the end of epoch ..."): the checkpoint says which step either way.
stop_steps="$("$FERRY" inspect "$scratch/stop.safetensors" --json 2>/dev/null |
              python3 -c 'import json, sys; print(json.load(sys.stdin)["metadata"]["global_step"])' 2>/dev/null)"
if [[ -n "$rank1" && $rc -ne 0 && -n "$stop_steps" ]] &&
   grep -Eq "^stopped on request \(signal 15\) (after $stop_steps steps|at the end of epoch).*checkpoint written to" \
     "$scratch/stop.out"; then
  ok "SIGTERM to rank 1 alone: both ranks stopped after step $stop_steps, rank 0's checkpoint holds it (mpirun exit $rc)"
  if mpi 2 "$FERRY" "${stop_args[@]}" --ddp --resume "$scratch/stop.safetensors" --max-steps $((stop_steps + 2)) \
       --check-replicas-every 1 --checkpoint "$scratch/resumed.safetensors" >"$scratch/resumed.out" 2>"$scratch/resumed.err" &&
     mpi 2 "$FERRY" "${stop_args[@]}" --ddp --max-steps $((stop_steps + 2)) --checkpoint "$scratch/straight.safetensors" \
       >"$scratch/straight.out" 2>"$scratch/straight.err" &&
     compare "$scratch/resumed.safetensors" "$scratch/straight.safetensors"; then
    ok "mpirun -np 2 --resume: 2 steps more, the parameters of $((stop_steps + 2)) steps straight"
  else
    fail "resume after the stop: $(tail -c 600 "$scratch/resumed.err") $(tail -c 400 "$scratch/straight.err")"
  fi
else
  fail "stop on rank 1 (pid '$rank1', mpirun exit $rc, steps '$stop_steps', handler said $(grep -c 'stopping after this step' "$scratch/stop.err") time(s)): $(tail -c 600 "$scratch/stop.err") $(tail -c 400 "$scratch/stop.out")"
fi

# --- Exercise 5.2: N must divide B --------------------------------------------------------------------------
rc=0
mpi 4 "$FERRY" train --ddp --device cpu --batch 30 --max-steps 1 --limit-train 64 --limit-test 64 --data "$data_dir" \
  >"$scratch/bn.out" 2>"$scratch/bn.err" || rc=$?
if [[ $rc -ne 0 ]] && grep -q "B = 30" "$scratch/bn.err" && grep -q "N = 4" "$scratch/bn.err" &&
   grep -q "28" "$scratch/bn.err" && grep -q "32" "$scratch/bn.err"; then
  ok "--batch 30 over 4 ranks: refused, naming B, N, 28 and 32"
else
  fail "B/N error (exit $rc): $(head -c 600 "$scratch/bn.err")"
fi

# --- ranks started with different options: every rank stops before training, naming the option and both values
# (another --seed trained silently on the wrong samples; another --batch made the collectives differ and crash) ---
for differing in "--seed 1:--seed 2:--seed is 1 on rank 0 but 2 on rank 1" \
                 "--batch 64:--batch 32:--batch is 64 on rank 0 but 32 on rank 1" \
                 "--allreduce-dtype float32:--allreduce-dtype bfloat16:dtype is float32 on rank 0 but bfloat16"; do
  IFS=: read -r rank0_option rank1_option expected <<<"$differing"
  base=(train --ddp --model mlp --device cpu --max-steps 2 --limit-train 256 --limit-test 64 --data "$data_dir")
  rc=0
  # shellcheck disable=SC2086  # the options split into flag and value on purpose
  timeout 120 mpirun --oversubscribe --bind-to none -np 1 "$FERRY" "${base[@]}" $rank0_option \
    : -np 1 "$FERRY" "${base[@]}" $rank1_option >"$scratch/differ.out" 2>"$scratch/differ.err" || rc=$?
  if [[ $rc -eq 2 ]] && [[ $(grep -c -- "$expected" "$scratch/differ.err") -eq 2 ]] &&
     ! grep -q "step 1/" "$scratch/differ.out"; then
    ok "$rank0_option on rank 0, $rank1_option on rank 1: both ranks refuse before training (exit 2)"
  else
    fail "different options across ranks ($rank0_option / $rank1_option), exit $rc: $(tail -c 600 "$scratch/differ.err")"
  fi
done

# --- GPU machine only (scripts/gpu-check runs this through ctest): NCCL with one rank, MPI staging with two
# ranks on one GPU, each 4 steps of the mlp against one cuda process's parameters.
if "$FERRY" devices --json 2>/dev/null | grep -q '"cuda:0"'; then
  cuda_args=(train --model mlp --device cuda --batch 64 --max-steps 4 --limit-train 512 --limit-test 64 --log-every 2
             --json --data "$data_dir")
  "$FERRY" "${cuda_args[@]}" --checkpoint "$scratch/cuda_single.safetensors" >/dev/null 2>"$scratch/cuda_single.err" ||
    fail "cuda single-process run: $(tail -c 600 "$scratch/cuda_single.err")"
  # The third: NCCL's own bfloat16 sum of the compressed gradients (within 1 % of float32's parameters).
  for setup in "1 nccl float32 1e-5" "2 mpi float32 1e-5" "1 nccl bfloat16 1e-2"; do
    read -r n backend dtype bound <<<"$setup"
    run="cuda_${backend}_$dtype"
    if mpi "$n" "$FERRY" "${cuda_args[@]}" --ddp --ddp-backend "$backend" --allreduce-dtype "$dtype" \
         --check-replicas-every 1 --checkpoint "$scratch/$run.safetensors" >"$scratch/$run.json" 2>"$scratch/$run.err" &&
       grep -q "\"comm_backend\":\"$backend\"" "$scratch/$run.json" &&
       compare "$scratch/$run.safetensors" "$scratch/cuda_single.safetensors" "$bound"; then
      ok "cuda: mpirun -np $n --ddp-backend $backend --allreduce-dtype $dtype matches one cuda process (to $bound)"
    else
      fail "cuda -np $n $backend $dtype: $(tail -c 600 "$scratch/$run.err") $(head -c 400 "$scratch/$run.json")"
    fi
  done
else
  echo "skip (cuda parts): no cuda device here"
fi

# --- failures: a rank that dies, and one that stalls, stop the others within 60 s with a non-zero exit -------
# start_long_run LOG ARGS...: a long mlp run in the background; waits until rank 0 logs its 2nd step.
start_long_run() {
  local log=$1
  shift
  # mpirun itself in the background (not a function's subshell): its children are the ranks.
  mpirun -np 2 --oversubscribe --bind-to none "$FERRY" train --ddp --model mlp --device cpu --batch 64 --epochs 1 \
    --log-every 1 --limit-test 64 --data "$data_dir" "$@" >"$log" 2>&1 &
  background_pid=$!
  for _ in $(seq 1 600); do
    grep -q "step 2/" "$log" && return 0
    kill -0 "$background_pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# the rank processes: mpirun's children running ferry
rank_pids() { ps -o pid=,comm= --ppid "$background_pid" | awk '$2 == "ferry" { print $1 }'; }

for how in KILL STOP; do
  log="$scratch/fail_$how.log"
  extra=()
  [[ $how == STOP ]] && extra=(--ddp-timeout 8)
  if ! start_long_run "$log" "${extra[@]}"; then
    fail "failure test ($how): the run did not start: $(tail -c 600 "$log")"
    continue
  fi
  victim=$(rank_pids | tail -n 1)
  if [[ -z "$victim" ]]; then
    fail "failure test ($how): no rank process found under mpirun (pid $background_pid)"
    kill "$background_pid" 2>/dev/null; wait "$background_pid"
    background_pid=""
    continue
  fi
  began=$(date +%s)
  kill -s "$how" "$victim"
  rc=0
  timeout 90 tail --pid="$background_pid" -f /dev/null || kill "$background_pid" 2>/dev/null  # hung: stop it
  wait "$background_pid" || rc=$?
  elapsed=$(( $(date +%s) - began ))
  # a stopped rank the launcher left behind (still our ferry process, not a reused pid)
  [[ "$(ps -o comm= -p "$victim" 2>/dev/null)" == ferry ]] && kill -9 "$victim" 2>/dev/null
  background_pid=""
  expected="exited on signal|Collective timed out|MPI error"
  [[ $how == STOP ]] && expected="Collective timed out"
  if [[ $rc -ne 0 && $elapsed -le 60 ]] && grep -Eq "$expected" "$log"; then
    ok "SIG$how to rank pid $victim: the job stopped in ${elapsed} s, exit $rc: $(grep -Eo "($expected).{0,60}" "$log" | head -n 1)"
  else
    fail "SIG$how to a rank: exit $rc after ${elapsed} s; log: $(tail -c 800 "$log")"
  fi
done

finish test_ddp
