#!/usr/bin/env bash
# `ferry bench link` on the emulated card (tests/cuda_on_host): the pageable rows' staging ring as a user meets it.
#  - a staging variable with a value ferry cannot use stops the first staged copy with one line naming it, status 2,
#    as does a FERRY_CUDNN that is neither on nor off (read when the bench asks the card's properties);
#  - at 64 MiB the ring chooses its way before the clock starts, and the report says which way it kept and where
#    its threads' time went (shares of their time that add up to at most 100 %), in the text and in the JSON.
# Checks words and sums, not times: the emulator's times are the host's.
#   link_bench_on_emulated_gpu.sh FERRY
set -euo pipefail
ferry=$1
out=${TMPDIR:-/tmp}/link_bench_$$
trap 'rm -f "$out".*' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for bad in FERRY_STAGING_THREADS=lots FERRY_STAGING_THREADS=0 FERRY_STAGING_THREADS=65 FERRY_STAGING_STREAMING=yes \
           FERRY_STAGING_CHUNK_MB=3 FERRY_CUDNN=maybe; do
  rc=0
  env "$bad" "$ferry" bench link --device cuda:0 --sizes 8MB --quiet > "$out.txt" 2> "$out.err" || rc=$?
  (( rc == 2 )) || fail "$bad: exit status $rc, expected 2 ($(cat "$out.err"))"
  grep -qE "^ferry: error: ${bad%%=*}='${bad#*=}'(: expected| is not a switch)" "$out.err" \
    || fail "$bad: no line naming it: $(cat "$out.err")"
  echo "$bad: status 2, $(head -1 "$out.err")"
done

"$ferry" bench link --device cuda:0 --sizes 64MiB --repeats 2 --quiet > "$out.txt"
"$ferry" bench link --device cuda:0 --sizes 64MiB --repeats 2 --quiet --json > "$out.json"
for direction in "host->device" "device->host"; do
  grep -qE "^pageable $direction: copies of 4 MiB or more go through the pinned staging ring, with " "$out.txt" \
    || fail "no line for the way kept, $direction: $(cat "$out.txt")"
done
[[ $(grep -cE "^  its threads, over [0-9]+ cop(y|ies) of 64 MiB or more: copying [0-9]+ % of the time \(.* together\), waiting for the link [0-9]+ %, the rest [0-9]+ %$" "$out.txt") == 2 ]] \
  || fail "not one line a direction on where the staging threads' time went: $(cat "$out.txt")"
python3 - "$out.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for direction in ("host_to_device", "device_to_host"):
    path = r["pageable_copy_path"][direction]
    t = path["staging_threads"]
    assert path["settled"], f"{direction}: not settled"
    assert t["copies"] >= 1, f"{direction}: {t}"
    assert 0 < t["copying_share"] and 0 <= t["waiting_share"], f"{direction}: {t}"
    assert t["copying_share"] + t["waiting_share"] <= 1 + 1e-9, f"{direction}: more than the threads' time: {t}"
    assert t["copying_bytes_per_second"] > 0, f"{direction}: {t}"
    print(f"{direction}: {t['copies']} copies, copying {t['copying_share']:.0%}, waiting {t['waiting_share']:.0%}")
PY
grep "its threads" "$out.txt"
