#!/usr/bin/env bash
# tests/cli/test_stop.sh PATH/TO/FERRY — Ctrl-C and SIGTERM during `ferry train`: the run stops after the step in
# progress, writes its checkpoint there, says how to continue, exits 128 + the signal, and --resume alone (the
# run's settings come from the checkpoint) goes on from that step; ferry eval knows the checkpoint's model; with
# --checkpoint-every, a kill -9 loses at most that many steps. Not here: that the continuation is bit for bit
# (tests/test_train.cpp, Trainer.StopRequest* and CheckpointEveryNSteps*, where things happen at steps that do not
# depend on timing); data-parallel ranks (tests/cli/test_ddp.sh).
set -u

FERRY="${1:?usage: test_stop.sh path/to/ferry}"
source "$(dirname "$0")/../script_lib.sh"
run_pid=""
on_exit '[[ -n "$run_pid" ]] && kill -KILL "$run_pid" 2>/dev/null'

data_dir="${FERRY_DATA:-/usr/share/datasets/fashion-mnist}"  # gpu-check points it at its copy
if [[ ! -f "$data_dir/train-images-idx3-ubyte.gz" ]]; then
  echo "SKIP: Fashion-MNIST not found in $data_dir (apt-get install dataset-fashion-mnist)"
  exit 0
fi

# A run far longer than the test (3200 steps); the signal comes once its metrics show a few steps.
long_run=(train --device cpu --model mlp --batch 32 --accumulate 2 --clip-grad-norm 5 --limit-train 1024 --limit-test 64
          --epochs 100 --log-every 1 --data "$data_dir")

# start_and_signal NAME SIGNAL ARGS...: starts `ferry ARGS --metrics` in the background (under `timeout`, which
# forwards a signal to ferry and then to its process group: ferry gets it twice), sends SIGNAL twice to timeout
# (KILL: once, to ferry) once 3 steps are logged (and the file $WAIT_FOR exists, when set), and sets `rc` to the
# exit status (stdout and stderr in $scratch/NAME.out, .err).
start_and_signal() {
  local name="$1" signal="$2"
  shift 2
  timeout -s KILL 300 "$FERRY" "$@" --metrics "$scratch/$name.jsonl" >"$scratch/$name.out" 2>"$scratch/$name.err" &
  run_pid=$!
  local waited=0
  until [[ $(grep -c '"kind":"step"' "$scratch/$name.jsonl" 2>/dev/null) -ge 3 && ( -z "${WAIT_FOR:-}" || -f "${WAIT_FOR:-}" ) ]]; do
    sleep 0.05
    waited=$((waited + 1))
    if [[ $waited -gt 2400 ]] || ! kill -0 "$run_pid" 2>/dev/null; then break; fi
  done
  if [[ $signal == KILL ]]; then  # timeout cannot pass on a SIGKILL: ferry itself gets it
    kill -KILL "$(pgrep -P "$run_pid" | head -n 1)" 2>/dev/null
  else
    kill "-$signal" "$run_pid" 2>/dev/null
    kill "-$signal" "$run_pid" 2>/dev/null  # twice at once, as wrappers deliver it: still one clean stop
  fi
  rc=0
  wait "$run_pid" || rc=$?
  run_pid=""
}

# --- Ctrl-C with --checkpoint: exit 130, the checkpoint at the step reached, one line saying how to continue ----
checkpoint="$scratch/stopped.safetensors"
start_and_signal int INT "${long_run[@]}" --checkpoint "$checkpoint"
if [[ $rc -eq 130 ]] && grep -q "stopping after this step" "$scratch/int.err" &&
   grep -q "^ferry: stopped by SIGINT (Ctrl-C) after [0-9]* steps\?; $checkpoint holds it: continue with ferry train --resume $checkpoint" "$scratch/int.err" &&
   grep -Eq "^stopped on request \(signal 2\) (after [0-9]+ steps, in epoch [0-9]+ at batch [0-9]+ of 32|at the end of epoch [0-9]+); checkpoint written to $checkpoint" "$scratch/int.out" &&
   grep -q "Where the time went" "$scratch/int.out"; then
  ok "SIGINT: exit 130, the report, and one line naming the checkpoint and --resume"
else
  fail "SIGINT: exit $rc, stderr: $(tail -c 600 "$scratch/int.err"), stdout: $(tail -c 400 "$scratch/int.out")"
fi
steps="$(sed -n 's/^ferry: stopped by SIGINT (Ctrl-C) after \([0-9]*\) steps.*/\1/p' "$scratch/int.err")"
if [[ -n "$steps" ]] && "$FERRY" inspect "$checkpoint" --json >"$scratch/inspect.json" 2>"$scratch/inspect.err" &&
   python3 - "$scratch/inspect.json" "$steps" >"$scratch/batch_in_epoch" <<'PY'; then
import json, sys
m = json.load(open(sys.argv[1]))["metadata"]
steps = int(sys.argv[2])
assert int(m["global_step"]) == steps, (m, steps)
assert int(m["epoch"]) * 32 + int(m["batch_in_epoch"]) == steps, m  # 32 steps per epoch
print(m["batch_in_epoch"])
PY
  ok "the checkpoint holds step $steps, where the run stopped"
else
  fail "checkpoint after SIGINT (steps '$steps'): $(tail -c 400 "$scratch/inspect.err") $(head -c 600 "$scratch/inspect.json")"
fi

# --- --resume alone (no model, batch or data options: the checkpoint's run's) goes on from that step ---------------
if [[ -n "$steps" ]] &&
   timeout 300 "$FERRY" train --device cpu --data "$data_dir" --resume "$checkpoint" --max-steps $((steps + 3)) \
     >"$scratch/resumed.out" 2>"$scratch/resumed.err" &&
   grep -q "^the run's settings, from $checkpoint: --model mlp --batch 32 --accumulate 2 --clip-grad-norm 5 --epochs 100 .*--limit-train 1024 --limit-test 64" \
     "$scratch/resumed.out" &&
   grep -q "^resumed from $checkpoint at epoch [0-9]*, batch [0-9]* (step $steps)" "$scratch/resumed.out" &&
   grep -q "^stopped after $((steps + 3)) steps (--max-steps)" "$scratch/resumed.out"; then
  ok "--resume alone took the run's settings and went on from step $steps to $((steps + 3))"
else
  fail "--resume after SIGINT: $(tail -c 600 "$scratch/resumed.err") $(head -c 600 "$scratch/resumed.out")"
fi

# --- within an epoch, other batches cannot continue it: exit 2, one line with both; ferry eval knows the model -------
rc=0
"$FERRY" train --device cpu --data "$data_dir" --resume "$checkpoint" --batch 64 >"$scratch/other.out" \
  2>"$scratch/other.err" || rc=$?
if [[ "$(cat "$scratch/batch_in_epoch" 2>/dev/null)" == 0 ]]; then
  echo "skip (other batches): the signal came during a test pass, so the checkpoint is at an epoch end"
elif [[ $rc -eq 2 && $(wc -l <"$scratch/other.err") -eq 1 ]] &&
   grep -q "batches of 32 over 1024 training images; this run has batches of 64 over 1024" "$scratch/other.err"; then
  ok "--resume within an epoch with --batch 64 (the run's was 32): exit 2, one line naming both"
else
  fail "--resume --batch 64: exit $rc, $(head -c 600 "$scratch/other.err")"
fi
if "$FERRY" eval --checkpoint "$checkpoint" --device cpu --data "$data_dir" --json >"$scratch/eval.json" \
     2>"$scratch/eval.err" && grep -q '"model":"mlp"' "$scratch/eval.json"; then
  ok "ferry eval reads the model (mlp) from the checkpoint"
else
  fail "ferry eval of an mlp checkpoint: $(head -c 600 "$scratch/eval.err")"
fi

# --- SIGTERM (a scheduler's stop) without --checkpoint: exit 143, and it says the progress is not saved -------------
start_and_signal term TERM "${long_run[@]}"
if [[ $rc -eq 143 ]] &&
   grep -q "^ferry: stopped by SIGTERM after [0-9]* steps; no --checkpoint was given, so the progress is not saved" "$scratch/term.err"; then
  ok "SIGTERM without --checkpoint: exit 143, says nothing was saved"
else
  fail "SIGTERM: exit $rc, stderr: $(tail -c 600 "$scratch/term.err")"
fi

# --- --checkpoint-every 5, then kill -9 (nothing to catch): the checkpoint holds a multiple of 5 steps and resumes ---
every="$scratch/every.safetensors"
WAIT_FOR="$every" start_and_signal killed KILL "${long_run[@]}" --checkpoint "$every" --checkpoint-every 5
if "$FERRY" inspect "$every" --json >"$scratch/every.json" 2>"$scratch/every.err" &&
   python3 - "$scratch/every.json" >"$scratch/every_steps" <<'PY' &&
import json, sys
m = json.load(open(sys.argv[1]))["metadata"]
step = int(m["global_step"])
assert step > 0 and (step % 5 == 0 or m["batch_in_epoch"] == "0"), m
print(step)
PY
   timeout 300 "$FERRY" train --device cpu --data "$data_dir" --resume "$every" --max-steps $(( $(cat "$scratch/every_steps") + 1 )) \
     >"$scratch/every_resumed.out" 2>"$scratch/every_resumed.err"; then
  ok "--checkpoint-every 5 and kill -9 (exit $rc): the checkpoint held step $(cat "$scratch/every_steps"), and --resume went on"
else
  fail "--checkpoint-every 5 and kill -9 (exit $rc): $(tail -c 300 "$scratch/every.err") $(head -c 300 "$scratch/every.json") $(tail -c 300 "$scratch/every_resumed.err")"
fi

finish test_stop
