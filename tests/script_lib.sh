# tests/script_lib.sh — what the test scripts under tests/cli and tests/install share. Source it after `set -u`:
#   source "$(dirname "$0")/../script_lib.sh"
# It gives $scratch, a fresh folder removed at exit; `fail TEXT` and `ok TEXT`, one line each (fail on stderr,
# counted in $failures); `on_exit 'COMMAND'`, run at exit before the folder goes (a process left to stop); and
# `finish NAME`, which prints "NAME: N failure(s), S s" and exits 1 when anything failed, else 0.
failures=0
scratch="$(mktemp -d)"
START=$(date +%s)
_exit_commands=()

on_exit() { _exit_commands+=("$1"); }
_at_exit() {
  local command
  for command in "${_exit_commands[@]}"; do eval "$command"; done
  rm -rf "$scratch"
}
trap _at_exit EXIT

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
ok() { echo "ok: $*"; }

finish() {
  echo "$1: $failures failure(s), $(($(date +%s) - START)) s"
  exit $((failures > 0))
}
