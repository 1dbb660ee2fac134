#!/usr/bin/env bash
# tests/cli/test_bench.sh — runs `ferry bench link|memory|gemm|golden` at small sizes, the profile they save,
# `ferry plan --profile`, `ferry plan speedup --gpu/--cpu` and `ferry devices`; usage: test_bench.sh path/to/ferry
# Not here: the timing code's own tests (tests/test_profile.cpp). Checks JSON output and exit codes; runs in seconds.
set -u

FERRY="${1:?usage: test_bench.sh path/to/ferry}"
source "$(dirname "$0")/../script_lib.sh"
export FERRY_SIM_LINK=16GB/s
unset FERRY_PROFILE

# check_json 'PYTHON_CONDITION' ARGS...: `ferry ARGS` must exit 0 and print one line of JSON on stdout for
# which the Python expression (over `j`, the parsed object) is true.
check_json() {
  local condition="$1"
  shift
  local rc=0
  "$FERRY" "$@" >"$scratch/out" 2>"$scratch/err" || rc=$?
  if [[ $rc -ne 0 ]]; then
    fail "ferry $* exited $rc: $(cat "$scratch/err")"
    return
  fi
  if ! python3 -c '
import json, sys
lines = open(sys.argv[2]).read().splitlines()
if len(lines) != 1:
    sys.exit(f"expected one line of JSON, got {len(lines)}")
j = json.loads(lines[0])
if not eval("(" + sys.argv[1] + ")"):
    sys.exit("condition false: " + sys.argv[1])
' "$condition" "$scratch/out"; then
    fail "ferry $* printed: $(head -c 600 "$scratch/out")"
    return
  fi
  echo "ok: ferry $*"
}

# check_file 'PYTHON_CONDITION' FILE: FILE must be JSON for which the condition (over `j`) is true.
check_file() {
  if ! python3 -c '
import json, sys
j = json.load(open(sys.argv[2]))
if not eval("(" + sys.argv[1] + ")"):
    sys.exit("condition false: " + sys.argv[1])
' "$1" "$2"; then
    fail "$2: $(head -c 600 "$2")"
    return
  fi
  echo "ok: $2 holds $1"
}

# expect_status CODE 'TEXT' ARGS...: `ferry ARGS` must exit CODE with TEXT on stderr and nothing on stdout.
expect_status() {
  local code="$1" needle="$2"
  shift 2
  local rc=0
  "$FERRY" "$@" >"$scratch/out" 2>"$scratch/err" || rc=$?
  if [[ $rc -ne $code ]]; then
    fail "ferry $* exited $rc, expected $code: $(cat "$scratch/err")"
    return
  fi
  if [[ -s "$scratch/out" ]]; then
    fail "ferry $* printed on stdout: $(head -c 300 "$scratch/out")"
    return
  fi
  if ! grep -qF -- "$needle" "$scratch/err"; then
    fail "ferry $* stderr lacks '$needle': $(cat "$scratch/err")"
    return
  fi
  echo "ok: ferry $* -> $code"
}

profile="$scratch/profile.json"
fast=(--repeats 2 --max-seconds 0.5)

# ---- bench link ----------------------------------------------------------------------------------
check_json 'j["bench"] == "link" and j["device"] == "sim:0" and len(j["paths"]) == 2
  and all(len(p["points"]) == 2 and p["bytes_per_second"] > 0 for p in j["paths"])
  and [p["bytes"] for p in j["paths"][0]["points"]] == [4000, 1000000]
  and {p["path"] for p in j["paths"]} == {"host_to_device_pageable", "device_to_host_pageable"}
  and len(j["skipped"]) == 2 and j["link_setting_bytes_per_second"] == 16e9' \
  bench link --device sim:0 --sizes 4KB,1MB "${fast[@]}" --json
check_json 'j["with_allocation"] is True and j["paths"][0]["points"][0]["bytes"] == 65536' \
  bench link --device sim:0 --sizes 64KiB "${fast[@]}" --with-allocation --json
check_json 'j["profile"].endswith("profile.json") and j["trace"].endswith("trace.json")' \
  bench link --device sim:0 --sizes 64KB,1MB "${fast[@]}" --save "$profile" --trace "$scratch/trace.json" --json
check_file 'j["format"] == "ferry profile" and j["devices"][0]["device"] == "sim:0"
  and j["devices"][0]["link"]["host_to_device_pageable"]["bytes_per_second"] > 0' "$profile"
check_file 'any(e["ph"] == "X" and e["cat"] == "transfer" and e["args"]["label"] == "bench link"
  and e["args"]["bytes"] == 64000 for e in j["traceEvents"])' "$scratch/trace.json"
if "$FERRY" bench link --device sim:0 --sizes 4KB --repeats 1 >"$scratch/out" 2>"$scratch/err" \
   && grep -q "host->device pageable" "$scratch/out" && grep -q "Exercise 2.2" "$scratch/out"; then
  echo "ok: ferry bench link prints a table"
else
  fail "ferry bench link table: $(cat "$scratch/out" "$scratch/err")"
fi

# ---- bench memory and gemm, saved into the same profile -----------------------------------------
check_json 'j["bench"] == "memory" and j["copy"]["bytes_per_second"] > 0 and j["add"]["bytes_per_second"] > 0
  and len(j["copy"]["points"]) == 1' bench memory --device cpu --sizes 1MB "${fast[@]}" --save "$profile" --json
check_json 'j["bench"] == "gemm" and j["dtype"] == "float32" and [p["n"] for p in j["points"]] == [32, 64]
  and j["flop_per_second"] == max(p["flop_per_second"] for p in j["points"])' \
  bench gemm --device cpu --sizes 32,64 "${fast[@]}" --save "$profile" --json
check_json 'j["bench"] == "gemm" and j["device"] == "sim:0"' bench gemm --device sim:0 --sizes 16 --repeats 1 --json
check_file '{d["device"] for d in j["devices"]} == {"sim:0", "cpu"}
  and "link" in j["devices"][0] and "memory" in j["devices"][1] and "gemm" in j["devices"][1]' "$profile"

# ---- ferry plan with the profile ----------------------------------------------------------------
check_json 'j["bytes"] == 4000000 and j["seconds"] > 0 and j["seconds_at_16GB_per_s"] == 0.00025
  and abs(j["bytes_per_second"] * j["seconds"] - 4e6) < 1' \
  plan transfer --bytes 4MB --profile "$profile" --device sim:0 --json
check_json 'j["seconds"] > 0' plan --profile "$profile" transfer --shape 1000x1000 --json
check_json 'j["seconds"] > 0' plan transfer --bytes 4MB --profile "$profile" --direction d2h --json
check_json 'j["seconds"] == 0.00025' plan transfer --bytes 4MB --link 16GB/s --json
expect_status 2 "--link" plan transfer --bytes 4MB --json
expect_status 2 "pinned" plan transfer --bytes 4MB --profile "$profile" --pinned --json
# sim has no pinned memory: the advice names a device that has (cuda), not the sim bench that cannot measure it.
expect_status 2 "measure pinned copies on a cuda device" plan transfer --bytes 4MB --profile "$profile" --pinned
if grep -qF -- "--device sim:0" "$scratch/err"; then fail "pinned advice names sim:0: $(cat "$scratch/err")"; fi
expect_status 2 "no device 'sim:5'" plan transfer --bytes 4MB --profile "$profile" --device sim:5
expect_status 2 "direction" plan transfer --bytes 4MB --profile "$profile" --direction sideways
expect_status 1 "Cannot read the profile" plan transfer --bytes 4MB --profile "$scratch/missing.json"
# A --profile given to `ferry plan` is read whatever the subcommand: missing or a directory, it fails.
expect_status 1 "Cannot read the profile" plan --profile "$scratch/missing.json" golden --speedup 250 --compute 0.1s \
  --transfer 0.7s
expect_status 1 "Cannot read the profile" plan --profile "$scratch/missing.json" bytes --shape 4x4
expect_status 1 "is a directory" plan --profile "$scratch" transfer --bytes 4MB
expect_status 1 "is a directory" plan transfer --bytes 4MB --profile "$scratch"

# ---- ferry plan speedup from the devices, ferry devices -----------------------------------------
check_json 'j["speedup"] == 1 and j["cpu_cores"] >= 1' plan speedup --gpu sim:0 --cpu --json
check_json 'j["speedup"] > 0 and j["gpu_cores"] == 8000' plan speedup --gpu-clock 1.5GHz --gpu-cores 8000 --cpu --json
check_json 'j["speedup"] == 250' plan speedup --gpu-clock 1.5GHz --gpu-cores 8000 --cpu-clock 3GHz --cpu-cores 16 --json
expect_status 2 "--cpu-clock" plan speedup --gpu sim:0
expect_status 2 "cuda:7" plan speedup --gpu cuda:7 --cpu
check_json 'all(("speedup_theoretical" in d) == (d["device"] != "cpu") for d in j["devices"])
  and all(d["speedup_theoretical"] == 1 for d in j["devices"] if d["device"].startswith("sim"))' devices --json
# without a cuda device, why not (in words, then the driver's answer); with one, no such line
check_json '("cuda_unavailable_reason" in j) != any(d["device"].startswith("cuda:") for d in j["devices"])
  and len(j.get("cuda_unavailable_reason", "x")) > 0' devices --json
if grep -q '"cuda_unavailable_reason"' "$scratch/out"; then
  if "$FERRY" devices | tail -n 1 | grep -q "^cuda     none: ."; then
    ok "ferry devices says why there is no cuda device"
  else
    fail "ferry devices has no 'cuda     none: <why>' line: $("$FERRY" devices | tail -n 2)"
  fi
fi
# the cpu's BLAS and its kernels, and the variable that chose them where one did
OPENBLAS_CORETYPE=Haswell check_json '"Haswell kernels (OPENBLAS_CORETYPE=Haswell" in
  [d for d in j["devices"] if d["device"] == "cpu"][0]["libraries"]' devices --json
env -u OPENBLAS_CORETYPE "$FERRY" devices --json >"$scratch/out" 2>"$scratch/err"
check_file '[d for d in j["devices"] if d["device"] == "cpu"][0]["libraries"].startswith("OpenBLAS ")
  and "OPENBLAS_CORETYPE" not in [d for d in j["devices"] if d["device"] == "cpu"][0]["libraries"]' "$scratch/out"
# and the convolutions' library, in a build with oneDNN (its --version names it)
if "$FERRY" --version | grep -q "; oneDNN "; then
  check_json '"; convolutions on oneDNN " in [d for d in j["devices"] if d["device"] == "cpu"][0]["libraries"]
    and " kernels)" in [d for d in j["devices"] if d["device"] == "cpu"][0]["libraries"]' devices --json
fi

# ---- bad input: exit 2, one line on stderr --------------------------------------------------------
expect_status 2 "no host link" bench link --device cpu --sizes 4KB
expect_status 2 "4XB" bench link --device sim:0 --sizes 4XB
expect_status 2 "--sizes" bench link --device sim:0 --sizes 0
expect_status 2 "2.5" bench gemm --device cpu --sizes 2.5
expect_status 2 "--repeats" bench memory --device cpu --sizes 1MB --repeats 0
expect_status 2 "cuda:7" bench gemm --device cuda:7 --sizes 16
expect_status 2 "bogus" bench link --device bogus
expect_status 2 "subcommand" bench
echo '{"not": "a profile"}' >"$scratch/other.json"
expect_status 1 "not a ferry profile" bench gemm --device cpu --sizes 16 --repeats 1 --save "$scratch/other.json"
check_file 'j == {"not": "a profile"}' "$scratch/other.json"
# --save that cannot be written fails before anything is measured: exit 2, no progress line, one line on stderr.
for target in "$scratch" "$scratch/no-such-folder/profile.json"; do
  expect_status 2 "--save" bench link --device sim:0 --sizes 4KB --repeats 1 --progress --save "$target"
  if [[ $(wc -l <"$scratch/err") -ne 1 ]]; then
    fail "bench link --save $target measured first: $(cat "$scratch/err")"
  fi
done
expect_status 2 "is a directory" bench link --device sim:0 --sizes 4KB --repeats 1 --save "$scratch"
expect_status 2 "does not exist" bench gemm --device cpu --sizes 16 --repeats 1 --save "$scratch/no-such-folder/p.json"

# ferry bench golden: every measurement present and positive; the printed prediction is the Golden Rule of the
# printed parts (S / (1 + T_transfer / T_compute)), and the error is against the measured S_real.
golden_ok='all(j["seconds_per_step"][k] > 0 for k in ("cpu", "resident", "copy", "per_step_copy", "item_every_step", "item_every_100", "sync_every_step"))
 and j["device"] == "sim:0" and j["batch"] == 16 and j["bytes_per_step"] > 0
 and abs(j["speedup"] - j["seconds_per_step"]["cpu"] / j["seconds_per_step"]["resident"]) < 1e-9 * j["speedup"]
 and abs(j["s_real_measured"] - j["seconds_per_step"]["cpu"] / j["seconds_per_step"]["per_step_copy"]) < 1e-9 * j["s_real_measured"]
 and abs(j["s_real_golden_rule"] - j["speedup"] / (1 + j["seconds_per_step"]["copy"] / j["seconds_per_step"]["resident"])) < 1e-9 * j["speedup"]
 and abs(j["golden_rule_error_percent"] - 100 * (j["s_real_golden_rule"] - j["s_real_measured"]) / j["s_real_measured"]) < 1e-6
 and abs(j["s_real_extended_model"] - j["seconds_per_step"]["cpu"] / (j["seconds_per_step"]["resident"] + j["seconds_per_step"]["copy"]
     + max(0.0, j["sync_cost_s"]))) < 1e-9 * j["s_real_extended_model"]
 and abs(j["sync_cost_s"] - (j["seconds_per_step"]["sync_every_step"] - j["seconds_per_step"]["item_every_100"])) < 1e-12
 and abs(j["item_cost_s"] - (j["seconds_per_step"]["item_every_step"] - j["seconds_per_step"]["item_every_100"])) < 1e-12
 and abs(j["extended_model_error_serial_percent"] - 100 * (j["s_real_extended_model"] - j["s_real_measured_serial"]) / j["s_real_measured_serial"]) < 1e-6'
# flops_per_step, by hand for batch 16: mlp 784-1024-1024-10: forward 2 * 1861632 per sample, weight gradients as
# much, input gradients of the last two layers 2 * 1058816; cnn: convolutions 1769472 + 9437184 + 9437184 and
# the linear layer 40960 per sample forward, the input gradients all but the first convolution's.
# bytes moved (model): 784 inputs, 4106 outputs (2 x [Linear 1024, ReLU], Linear 10; Flatten is a view) and
# 1863690 parameters per sample, in 1, 4 and 8 passes of 4 bytes.
check_json "$golden_ok and j['workload'] == 'mlp' and j['flops_per_step'] == 16 * (4 * 1861632 + 2 * 1058816)
 and j['bytes_moved_model_per_step'] == 4 * (16 * (784 + 4 * 4106) + 8 * 1863690)" \
  bench golden --workload mlp --device sim:0 --batch 16 --steps 2 --warmup 1 --json
check_json "$golden_ok and j['workload'] == 'cnn' and j['flops_per_step'] == 16 * (2 * 20684800 + 20684800 - 1769472)" \
  bench golden --workload cnn --device sim:0 --batch 16 --steps 2 --warmup 1 --json
expect_status 2 "cuda[:N] or sim[:N]" bench golden --device cpu --steps 1
expect_status 2 "mlp or cnn" bench golden --workload resnet --steps 1
expect_status 2 "--steps" bench golden --workload mlp --batch 4 --steps 0

finish test_bench
