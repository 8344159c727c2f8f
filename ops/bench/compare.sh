#!/usr/bin/env bash
# Run benchmarks of an earlier revision and of the working tree in one session, ABAB, so
# both see the same machine: `ops/bench/compare.sh REV [BENCH...]`.
#
# REV is checked out as a git worktree under ${TMPDIR:-/tmp}; its own exec helper is
# compiled there, and its code is put first on PYTHONPATH for its runs (the venv's
# editable install points at the working tree). BENCH defaults to the sandbox overhead
# benchmark; give e.g. "farm_throughput.py -n 1000" to compare another. Each run's
# `ratio.*` lines are printed with the revision they belong to.
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=${1:?usage: ops/bench/compare.sh REV [BENCH...]}
shift
benches=("$@")
[ ${#benches[@]} -gt 0 ] || benches=("sandbox_overhead.py -n 100")
python=.venv/bin/python
base=${TMPDIR:-/tmp}/sandfarm-bench-$(git rev-parse --short "$rev")
if [ ! -d "$base" ]; then
  git worktree add --detach -f "$base" "$rev" >/dev/null
fi
helper="$base/sandfarm-exec"
cc -O2 -o "$helper" "$base/sandbox_core/native/sandfarm-exec.c"

run() {  # label, bench command...
  local label=$1
  shift
  echo "## $label: $*"
  "$@" | grep -E '^(ratio|share|enqueue|farm|bare)\.' | sed "s/^/$label /"
}

for bench in "${benches[@]}"; do
  read -r -a argv <<<"$bench"
  for round in 1 2; do
    run "before#$round" env PYTHONPATH="$base" SANDFARM_EXEC_HELPER="$helper" \
      "$python" "$base/ops/bench/${argv[0]}" "${argv[@]:1}"
    run "after#$round" "$python" "ops/bench/${argv[0]}" "${argv[@]:1}"
  done
done
