#!/usr/bin/env bash
# test.sh — the README's second command (and CI's): install what is missing, build, run every test,
# then say how many ran, how many were skipped, and why.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir=${FERRY_BUILD_DIR:-build}
status=0
# ctest runs one test per core, and each test's OpenMP team wants every core: threads that spin while they wait
# (libgomp's default) then take the cores from the other tests' working threads. Passive waiting keeps the teams
# (their threaded paths stay tested) and gave the GoogleTest cases 25 s of wall time for 35-42 s on 2 cores.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# With sleeping threads ferry splits only loops 16x larger (src/cpu/parallel_cost.h); the tests' sizes were chosen
# for the threshold of spinning ones, so they keep it and their loops stay threaded.
export FERRY_PARALLEL_SCALE=${FERRY_PARALLEL_SCALE:-1}
ctest --test-dir "$build_dir" --output-on-failure -j "${FERRY_JOBS:-$(nproc)}" || status=$?
log="$build_dir/Testing/Temporary/LastTest.log"
if [ -f "$log" ]; then
  echo
  echo "Skipped tests and why:"
  # GoogleTest prints the GTEST_SKIP() reason in the test's output; ctest keeps it in its log.
  python3 - "$log" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
found = 0
# ctest's log has one section per test, opened by "N/M Testing: NAME"; GoogleTest prints "file:line: Skipped"
# and the GTEST_SKIP() reason on the next line in the test's output.
for match in re.finditer(r"^\d+/\d+ Testing: (.+?)\n(.*?)(?=^\d+/\d+ Testing: |\Z)", text, re.S | re.M):
    name, section = match.group(1).strip(), match.group(2)
    if "[  SKIPPED ]" not in section:
        continue
    reason = re.search(r"Skipped\s*\n(.*)", section)
    print(f"  {name}: {reason.group(1).strip() if reason else '(no reason given)'}")
    found += 1
if not found:
    print("  none")
PY
fi

# Hardening (docs/reliability.md): the cpu suite again under ASan + UBSan, every committed fuzz input replayed,
# then a short bounded fuzz of each target. FERRY_HARDENING=0 skips it; FERRY_FUZZ_SECONDS sets the fuzz time.
if [ "${FERRY_HARDENING:-1}" != 0 ]; then
  hardening_start=$SECONDS
  for step in "scripts/sanitize.sh" "scripts/fuzz.sh replay" "scripts/fuzz.sh run ${FERRY_FUZZ_SECONDS:-20}"; do
    step_start=$SECONDS
    echo
    echo "== $step"
    bash $step || { echo "== $step FAILED"; [ "$status" -ne 0 ] || status=1; }
    echo "== $step: $((SECONDS - step_start)) s"
  done
  echo "Hardening took $((SECONDS - hardening_start)) s"
fi
exit $status
