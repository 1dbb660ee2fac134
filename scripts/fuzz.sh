#!/usr/bin/env bash
# fuzz.sh — build and run ferry's libFuzzer targets (fuzz/): the safetensors and idx readers, Device::parse and
# the unit parsers. Not the unit tests: those are scripts/test.sh; this needs clang and libclang-rt-14-dev.
#   scripts/fuzz.sh                 build the targets in build-fuzz (FERRY_FUZZ_BUILD_DIR)
#   scripts/fuzz.sh replay          build, then run every committed input in fuzz/corpus/<target>/ once
#   scripts/fuzz.sh run SECONDS     build, then fuzz each target for SECONDS (seeds: fuzz/corpus/<target>/;
#                                   what it learns: build-fuzz/corpus/<target>/; findings: build-fuzz/findings/)
#   scripts/fuzz.sh merge           fold build-fuzz/corpus/<target>/ into the committed corpora (minimised)
#   FERRY_FUZZ_TARGETS="idx units"  run only these targets
# Prints how many inputs each target ran and what it found; exits 1 when anything was found.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build_dir=${FERRY_FUZZ_BUILD_DIR:-build-fuzz}
targets=(${FERRY_FUZZ_TARGETS:-safetensors idx device units})
mode=${1:-build}

build() {
  local compiler
  compiler=$(command -v clang++ || command -v clang++-14 || true)
  if [ -z "$compiler" ]; then
    echo "fuzz.sh: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2
    exit 2
  fi
  if [ ! -f "$build_dir/build.ninja" ]; then
    cmake -S fuzz -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER="$compiler" >/dev/null
  fi
  if ! cmake --build "$build_dir" -j "${FERRY_JOBS:-$(nproc)}" -- $(printf 'fuzz_%s ' "${targets[@]}") \
    >"$build_dir/build.log" 2>&1; then
    grep -E 'error|FAILED' "$build_dir/build.log" | head -20 >&2
    echo "fuzz.sh: building the fuzz targets failed; see $build_dir/build.log" >&2
    exit 1
  fi
}

# The sanitizers abort at the first error; leaks are findings too.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

dict_args() {  # the target's dictionary, when it has one
  [ -f "fuzz/$1.dict" ] && echo "-dict=fuzz/$1.dict" || true
}

# libFuzzer's last "#N DONE"/"Done N runs" line holds the number of inputs it ran.
runs_in() {
  sed -n -e 's/^Done \([0-9]*\) runs.*/\1/p' -e 's/^#\([0-9]*\)[[:space:]]*DONE.*/\1/p' "$1" | tail -1
}

found=0
summary=()

replay() {
  for target in "${targets[@]}"; do
    local corpus="fuzz/corpus/$target" log="$build_dir/replay-$target.log" inputs rc=0
    local files=()
    mapfile -d '' files < <(find "$corpus" -type f -print0 | sort -z)
    inputs=${#files[@]}
    # Files (not a folder) on the command line: libFuzzer runs each once and stops at the first finding.
    # Artifacts go to the build folder, never into fuzz/.
    "$build_dir/fuzz_$target" -timeout=10 -artifact_prefix="$build_dir/findings-$target-" \
      "${files[@]}" >"$log" 2>&1 || rc=$?
    if [ $rc -eq 0 ]; then
      summary+=("$(printf '%-12s replayed %5d inputs: nothing found' "$target" "$inputs")")
    else
      found=1
      summary+=("$(printf '%-12s replayed %5d inputs: FINDING (exit %d), see %s' "$target" "$inputs" "$rc" "$log")")
      grep -E 'ERROR|FINDING|runtime error|==[0-9]+==' "$log" | head -5 >&2 || true
    fi
  done
}

run() {
  local seconds=$1
  for target in "${targets[@]}"; do
    local work="$build_dir/corpus/$target" findings="$build_dir/findings/$target" log="$build_dir/run-$target.log"
    local rc=0 runs artifacts
    mkdir -p "$work" "$findings"
    # New inputs land in $work; the committed seeds are read, never written.
    "$build_dir/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      $(dict_args "$target") -artifact_prefix="$findings/" "$work" "fuzz/corpus/$target" >"$log" 2>&1 || rc=$?
    runs=$(runs_in "$log")
    artifacts=$(find "$findings" -type f | wc -l)
    if [ $rc -eq 0 ] && [ "$artifacts" -eq 0 ]; then
      summary+=("$(printf '%-12s ran %9s inputs in %ss, corpus %d files: nothing found' "$target" "${runs:-?}" \
        "$seconds" "$(find "$work" -type f | wc -l)")")
    else
      found=1
      summary+=("$(printf '%-12s ran %9s inputs in %ss: FINDING (exit %d, %d artifacts in %s), see %s' "$target" \
        "${runs:-?}" "$seconds" "$rc" "$artifacts" "$findings" "$log")")
      grep -E 'ERROR|FINDING|runtime error|==[0-9]+==' "$log" | head -5 >&2 || true
    fi
  done
}

merge() {
  for target in "${targets[@]}"; do
    [ -d "$build_dir/corpus/$target" ] || continue
    local before after
    before=$(find "fuzz/corpus/$target" -type f | wc -l)
    "$build_dir/fuzz_$target" -merge=1 "fuzz/corpus/$target" "$build_dir/corpus/$target" \
      >"$build_dir/merge-$target.log" 2>&1
    after=$(find "fuzz/corpus/$target" -type f | wc -l)
    summary+=("$(printf '%-12s corpus %d -> %d files' "$target" "$before" "$after")")
  done
}

case "$mode" in
  build) build; echo "fuzz.sh: built ${targets[*]} in $root/$build_dir"; exit 0 ;;
  replay) build; replay ;;
  run)
    seconds=${2:?usage: scripts/fuzz.sh run SECONDS}
    build
    run "$seconds"
    ;;
  merge) build; merge ;;
  *) echo "usage: scripts/fuzz.sh [build | replay | run SECONDS | merge]" >&2; exit 2 ;;
esac

echo "fuzz.sh $mode:"
printf '  %s\n' "${summary[@]}"
exit $found
