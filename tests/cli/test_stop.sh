#!/usr/bin/env bash
# tests/cli/test_stop.sh PATH/TO/FERRY — Ctrl-C and SIGTERM during `ferry train`: the run stops after the step in
# progress, writes its checkpoint there, says how to continue, exits 128 + the signal, and --resume goes on from
# that step. Not here: that the continuation is bit for bit (tests/test_train.cpp, Trainer.StopRequest*, where the
# request comes at a step that does not depend on timing); data-parallel ranks (tests/cli/test_ddp.sh).
set -u

FERRY="${1:?usage: test_stop.sh path/to/ferry}"
failures=0
scratch="$(mktemp -d)"
run_pid=""
cleanup() {
  [[ -n "$run_pid" ]] && kill -KILL "$run_pid" 2>/dev/null
  rm -rf "$scratch"
}
trap cleanup EXIT
START=$(date +%s)

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
ok() { echo "ok: $*"; }

data_dir=/usr/share/datasets/fashion-mnist
if [[ ! -f "$data_dir/train-images-idx3-ubyte.gz" ]]; then
  echo "SKIP: Fashion-MNIST not found in $data_dir (apt-get install dataset-fashion-mnist)"
  exit 0
fi

# A run far longer than the test (3200 steps); the signal comes once its metrics show a few steps.
long_run=(train --device cpu --model mlp --batch 32 --limit-train 1024 --limit-test 64 --epochs 100 --log-every 1
          --data "$data_dir")

# start_and_signal NAME SIGNAL ARGS...: starts `ferry ARGS --metrics` in the background, sends SIGNAL once 3 steps
# are logged, and sets `rc` to its exit status (stdout and stderr in $scratch/NAME.out, .err).
start_and_signal() {
  local name="$1" signal="$2"
  shift 2
  timeout -s KILL 300 "$FERRY" "$@" --metrics "$scratch/$name.jsonl" >"$scratch/$name.out" 2>"$scratch/$name.err" &
  run_pid=$!
  local waited=0
  until [[ $(grep -c '"kind":"step"' "$scratch/$name.jsonl" 2>/dev/null) -ge 3 ]]; do
    sleep 0.05
    waited=$((waited + 1))
    if [[ $waited -gt 2400 ]] || ! kill -0 "$run_pid" 2>/dev/null; then break; fi
  done
  kill "-$signal" "$run_pid" 2>/dev/null
  rc=0
  wait "$run_pid" || rc=$?
  run_pid=""
}

# --- Ctrl-C with --checkpoint: exit 130, the checkpoint at the step reached, one line saying how to continue ----
checkpoint="$scratch/stopped.safetensors"
start_and_signal int INT "${long_run[@]}" --checkpoint "$checkpoint"
if [[ $rc -eq 130 ]] && grep -q "stopping after this step" "$scratch/int.err" &&
   grep -q "^ferry: stopped by SIGINT (Ctrl-C) after [0-9]* steps; $checkpoint holds it: continue with ferry train --resume $checkpoint" "$scratch/int.err" &&
   grep -q "^stopped on request (signal 2) after [0-9]* steps, in epoch [0-9]* at batch [0-9]* of 32; checkpoint written to $checkpoint" "$scratch/int.out" &&
   grep -q "Where the time went" "$scratch/int.out"; then
  ok "SIGINT: exit 130, the report, and one line naming the checkpoint and --resume"
else
  fail "SIGINT: exit $rc, stderr: $(tail -c 600 "$scratch/int.err"), stdout: $(tail -c 400 "$scratch/int.out")"
fi
steps="$(sed -n 's/^stopped on request (signal 2) after \([0-9]*\) steps.*/\1/p' "$scratch/int.out")"
if [[ -n "$steps" ]] && "$FERRY" inspect "$checkpoint" --json >"$scratch/inspect.json" 2>"$scratch/inspect.err" &&
   python3 - "$scratch/inspect.json" "$steps" <<'PY'; then
import json, sys
m = json.load(open(sys.argv[1]))["metadata"]
steps = int(sys.argv[2])
assert int(m["global_step"]) == steps, (m, steps)
assert int(m["epoch"]) * 32 + int(m["batch_in_epoch"]) == steps, m  # 32 steps per epoch
PY
  ok "the checkpoint holds step $steps, where the run stopped"
else
  fail "checkpoint after SIGINT (steps '$steps'): $(tail -c 400 "$scratch/inspect.err") $(head -c 600 "$scratch/inspect.json")"
fi

# --- --resume from it: goes on from that step (to 3 steps more) --------------------------------------------------
if [[ -n "$steps" ]] &&
   timeout 300 "$FERRY" "${long_run[@]}" --resume "$checkpoint" --max-steps $((steps + 3)) --json \
     >"$scratch/resumed.json" 2>"$scratch/resumed.err" &&
   python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); assert j["steps"] == int(sys.argv[2]) and j["stopped_by_signal"] == 0, j' \
     "$scratch/resumed.json" $((steps + 3)); then
  ok "--resume went on from step $steps to $((steps + 3))"
else
  fail "--resume after SIGINT: $(tail -c 600 "$scratch/resumed.err") $(head -c 400 "$scratch/resumed.json")"
fi

# --- SIGTERM (a scheduler's stop) without --checkpoint: exit 143, and it says the progress is not saved -------------
start_and_signal term TERM "${long_run[@]}"
if [[ $rc -eq 143 ]] &&
   grep -q "^ferry: stopped by SIGTERM after [0-9]* steps; no --checkpoint was given, so the progress is not saved" "$scratch/term.err"; then
  ok "SIGTERM without --checkpoint: exit 143, says nothing was saved"
else
  fail "SIGTERM: exit $rc, stderr: $(tail -c 600 "$scratch/term.err")"
fi

echo "test_stop: $failures failure(s), $(( $(date +%s) - START )) s"
exit $(( failures > 0 ))
