#!/usr/bin/env bash
# bench/cuda_layer_bench on the emulated card (tests/cuda_on_host): both workloads, one timed step each. Checks
# the shape of its JSON, not its times (the emulator's event times are the host's): a stage for every call
# of the forward pass, a backward time wherever a gradient flows, and parts that add up to the step.
#   layer_bench_on_emulated_gpu.sh BENCH
set -euo pipefail
bench=$1
for workload in mlp cnn; do
  "$bench" --workload "$workload" --steps 1 > "${TMPDIR:-/tmp}/layer_bench_$$.json"
  python3 - "${TMPDIR:-/tmp}/layer_bench_$$.json" "$workload" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); workload = sys.argv[2]
stages = r["stages"]
names = [s["stage"] for s in stages]
expect = {"mlp": ["Linear", "Linear"], "cnn": ["Conv2d", "BatchNorm2d", "Linear"]}[workload]
for kind in expect:
    assert any(kind in n for n in names), f"{workload}: no {kind} stage in {names}"
assert r["workload"] == workload and r["steps"] == 1, r
for s in stages:
    assert s["forward_ms"] > 0 or "Flatten" in s["stage"], f"{workload}: stage {s['stage']} has no forward time"
    if "Flatten" not in s["stage"]:
        assert s["backward_ms"] > 0, f"{workload}: stage {s['stage']} has no backward time (its gradient hook did not fire?)"
for key in ("loss_forward_ms", "loss_backward_ms", "update_ms", "forward_ms", "backward_ms", "step_ms"):
    assert r[key] > 0, f"{workload}: {key} = {r[key]}"
parts = r["forward_ms"] + r["loss_forward_ms"] + r["loss_backward_ms"] + r["backward_ms"] + r["update_ms"]
assert abs(parts - r["step_ms"]) <= 0.01 * r["step_ms"] + 0.01, f"{workload}: parts {parts} ms, step {r['step_ms']} ms"
print(f"{workload}: {len(stages)} stages ({', '.join(names)}); parts add up to the step")
PY
done
rm -f "${TMPDIR:-/tmp}/layer_bench_$$.json"
