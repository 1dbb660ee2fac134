#!/usr/bin/env bash
# tests/cli/test_plan.sh — runs `ferry plan` on the exercise sheet's numbers and on bad input; usage: test_plan.sh path/to/ferry
# Not here: the arithmetic's own tests (tests/test_cost_model.cpp); this checks the command line, JSON and exit codes.
set -u

FERRY="${1:?usage: test_plan.sh path/to/ferry}"
source "$(dirname "$0")/../script_lib.sh"

# expect_json 'EXPECTED_JSON' ARGS...: `ferry ARGS --json` must exit 0 and print one JSON object whose keys
# include EXPECTED_JSON's with equal values. An expected integer must be printed as a JSON integer;
# an expected float is compared within 1e-9 (relative).
expect_json() {
  local expected="$1"
  shift
  local rc=0
  "$FERRY" "$@" --json >"$scratch/out" 2>"$scratch/err" || rc=$?
  if [[ $rc -ne 0 ]]; then
    fail "ferry $* --json exited $rc: $(cat "$scratch/err")"
    return
  fi
  if ! python3 -c '
import json, math, sys
expected = json.loads(sys.argv[1])
lines = open(sys.argv[2]).read().splitlines()
if len(lines) != 1:
    sys.exit(f"expected one line of JSON, got {len(lines)}")
actual = json.loads(lines[0])
if not isinstance(actual, dict):
    sys.exit("expected a JSON object")
for key, want in expected.items():
    if key not in actual:
        sys.exit(f"missing key {key!r} in {lines[0]}")
    got = actual[key]
    if isinstance(want, int):
        if not isinstance(got, int) or got != want:
            sys.exit(f"{key}: expected the integer {want}, got {got!r}")
    elif not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
        sys.exit(f"{key}: expected {want}, got {got!r}")
' "$expected" "$scratch/out"; then
    fail "ferry $* --json printed: $(cat "$scratch/out")"
    return
  fi
  echo "ok: ferry $* --json"
}

# expect_error 'TEXT|TEXT' ARGS...: `ferry ARGS` must exit 2, print nothing on stdout and exactly one line
# on stderr that starts with "ferry: error:" and contains each |-separated TEXT.
expect_error() {
  local needles="$1"
  shift
  local rc=0
  "$FERRY" "$@" >"$scratch/out" 2>"$scratch/err" || rc=$?
  local lines
  lines="$(wc -l <"$scratch/err")"
  if [[ $rc -ne 2 ]]; then
    fail "ferry $* exited $rc, expected 2 (stderr: $(cat "$scratch/err"))"
    return
  fi
  if [[ $lines -ne 1 ]]; then
    fail "ferry $* printed $lines lines on stderr, expected 1: $(cat "$scratch/err")"
    return
  fi
  if [[ -s "$scratch/out" ]]; then
    fail "ferry $* printed on stdout: $(cat "$scratch/out")"
    return
  fi
  if [[ "$(cat "$scratch/err")" != "ferry: error: "* ]]; then
    fail "ferry $*: stderr does not start with 'ferry: error: ': $(cat "$scratch/err")"
    return
  fi
  local needle
  IFS='|' read -ra needle_list <<<"$needles"
  for needle in "${needle_list[@]}"; do
    if ! grep -qF -- "$needle" "$scratch/err"; then
      fail "ferry $*: stderr lacks '$needle': $(cat "$scratch/err")"
      return
    fi
  done
  echo "ok: ferry $* fails with: $(cat "$scratch/err")"
}

# The sheet's numbers, one subcommand each.
expect_json '{"bytes": 4000000}' plan bytes --shape 1000x1000 --dtype float32                            # Ex 2.1
expect_json '{"bytes": 16}' plan bytes --shape 1000x1000 --shape 2x2  # an option given twice: its last value
expect_json '{"bytes": 2000000}' plan bytes --shape 1000x1000 --dtype bfloat16  # 16-bit storage: half the bytes
expect_json '{"seconds": 0.000125}' plan transfer --shape 1000x1000 --dtype half --link 16GB/s
expect_json '{"seconds": 0.00025}' plan transfer --bytes 4MB --link 16GB/s                              # Ex 2.2
expect_json '{"seconds": 0.00025}' plan transfer --shape 1000x1000 --dtype float32 --link 16GB/s        # Ex 2.2
expect_json '{"speedup": 250}' plan speedup --gpu-clock 1.5GHz --gpu-cores 8000 --cpu-clock 3GHz --cpu-cores 16  # Ex 2.3
expect_json '{"speedup_real": 31.25, "efficiency": 0.125}' plan golden --speedup 250 --compute 0.1s --transfer 0.7s  # Ex 3.1
expect_json '{"speedup_real": 250, "efficiency": 1}' plan golden --speedup 250 --compute 0.1s --transfer 0  # Ex 3.2
expect_json '{"bytes": 200000000, "bytes_ring_per_gpu": 150000000}' plan allreduce --params 25M --dtype float32 --gpus 4  # Ex 4.1
expect_json '{"per_gpu": 64}' plan batch --batch 256 --gpus 4                                            # Ex 4.2
expect_json '{"per_gpu": 128}' plan batch --batch 512 --gpus 4                                           # Ex 5.2
expect_json '{"total_s": 25.01, "total_s_log_every_step": 26.0, "waste_fraction": 0.0381}' \
  plan loop --transfer 5ms --compute 20ms --log 1ms --steps 1000 --log-every 100                           # Ex 5.1

# Bad input: exit status 2 and one line naming the problem.
expect_error 'B = 250|N = 4|248|252' plan batch --batch 250 --gpus 4
expect_error '"4XB"|MB' plan transfer --bytes 4XB --link 16GB/s
expect_error '"-3x4"|negative' plan bytes --shape -3x4 --dtype float32
expect_error 'GPUs' plan allreduce --params 25M --dtype float32 --gpus 0
# Size prefixes as SI writes them: suggestions never say "mB" (millibytes), and "mB" itself is refused.
expect_error '"4mb"|write MB for bytes or Mbit for bits' plan transfer --bytes 4mb --link 16GB/s
expect_error '"4gb"|write GB for bytes or Gbit for bits' plan transfer --bytes 4gb --link 16GB/s
expect_error '"4mB"|milli|write MB for 10^6 bytes' plan transfer --bytes 4mB --link 16GB/s
# --device, --direction and --pinned choose a profile's measured link: never ignored beside --link.
expect_error "--direction 'sideways'|host->device" plan transfer --bytes 4MB --link 16GB/s --direction sideways
expect_error '--direction|--profile' plan transfer --bytes 4MB --link 16GB/s --direction d2h
expect_error '--device|--profile' plan transfer --bytes 4MB --link 16GB/s --device nonsense
expect_error '--pinned|--profile' plan transfer --bytes 4MB --link 16GB/s --pinned
# A speedup is a positive number, not a count; a loop has at least one step.
expect_error "--speedup|positive|'-5'" plan golden --speedup -5 --compute 0.1s --transfer 0.7s
expect_error "--speedup|positive|'0'" plan golden --speedup 0 --compute 0.1s --transfer 0.7s
expect_json '{"speedup_real": 31.25}' plan golden --speedup 250x --compute 0.1s --transfer 0.7s
expect_error 'steps >= 1|got 0' plan loop --transfer 5ms --compute 20ms --log 1ms --steps 0 --log-every 100
expect_error 'every n >= 1|got 0' plan loop --transfer 5ms --compute 20ms --log 1ms --steps 1000 --log-every 0

# The explanation (no --json) shows the arithmetic.
if "$FERRY" plan bytes --shape 1000x1000 --dtype float32 | grep -qF "1,000,000 elements x 4 bytes"; then
  echo "ok: ferry plan bytes explains its arithmetic"
else
  fail "ferry plan bytes does not explain '1,000,000 elements x 4 bytes'"
fi

# A rate that is not a whole number of bytes/s is printed exactly, with separators (55.1 GiB/s = 59,163,174,502.4).
if "$FERRY" plan transfer --bytes 4000000 --link 55.1GiB/s |
  grep -qF "= 4,000,000 bytes / 59,163,174,502.4 bytes/s ="; then
  echo "ok: ferry plan transfer prints an inexact rate exactly, with separators"
else
  fail "ferry plan transfer --link 55.1GiB/s: $("$FERRY" plan transfer --bytes 4000000 --link 55.1GiB/s 2>&1)"
fi

# A command that needs no GPU starts without cuBLAS: linking it made every process run libcublasLt's constructors
# (~0.1 s, ~94 MB) before main; src/cuda/cublas_library.h loads it at the first GEMM on a cuda device instead.
for args in "--version" "plan bytes --shape 1000x1000 --dtype float32"; do
  # shellcheck disable=SC2086  # $args is the command line, split on purpose
  if LD_DEBUG=libs "$FERRY" $args 2>&1 >/dev/null | grep -q "libcublas"; then
    fail "ferry $args loaded cuBLAS at start-up: $(LD_DEBUG=libs "$FERRY" $args 2>&1 >/dev/null | grep -m2 libcublas)"
  else
    echo "ok: ferry $args starts without loading cuBLAS"
  fi
done

finish test_plan
