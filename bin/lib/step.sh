# shellcheck shell=bash
# step NAME CMD...: run CMD with its stdout and stderr captured in $step_out (for the caller to read).
# When CMD fails, its last $STEP_TAIL lines (default 60) go to stderr with a line that names the step, the
# command and its exit status, so no failing step of a script is silent. Returns CMD's exit status; the
# caller decides whether that ends the script (`step ... || exit 1`).
step_out=
step() {
  local name=$1 rc=0
  shift
  step_out=$("$@" 2>&1) || rc=$?
  if [ "$rc" -ne 0 ]; then
    printf '%s\n' "$step_out" | tail -n "${STEP_TAIL:-60}" >&2
    printf 'FAILED step "%s" (exit %s): %s\n' "$name" "$rc" "$*" >&2
  fi
  return "$rc"
}
