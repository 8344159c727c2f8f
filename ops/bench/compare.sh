#!/usr/bin/env bash
# Run benchmarks of two revisions in one session, ABAB, so both see the same machine:
#   ops/bench/compare.sh BEFORE AFTER [BENCH...]
# BEFORE and AFTER are git revisions ("." for the working tree). Each is checked out as a
# git worktree under ${TMPDIR:-/tmp} with its own exec helper, and each run starts in its
# tree with that tree first on PYTHONPATH (the venv's editable install points at the
# working tree; `python -m` puts the current directory first). BENCH defaults to the
# sandbox overhead benchmark; give e.g. "farm_throughput.py -n 1000" for another. Every
# output line is printed prefixed with the revision and round it belongs to.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
before=${1:?usage: ops/bench/compare.sh BEFORE AFTER [BENCH...]}
after=${2:?usage: ops/bench/compare.sh BEFORE AFTER [BENCH...]}
shift 2
benches=("$@")
[ ${#benches[@]} -gt 0 ] || benches=("sandbox_overhead.py -n 100")
python=$repo/.venv/bin/python

tree_of() {  # revision -> directory with that revision and its compiled exec helper
  local rev=$1 dir
  if [ "$rev" = . ]; then
    dir=$repo
  else
    dir=${TMPDIR:-/tmp}/sandfarm-bench-$(git rev-parse --short "$rev")
    [ -d "$dir" ] || git worktree add --detach -f "$dir" "$rev" >/dev/null
  fi
  cc -O2 -o "$dir/.bench-sandfarm-exec" "$dir/sandbox_core/native/sandfarm-exec.c"
  echo "$dir"
}
before_dir=$(tree_of "$before")
after_dir=$(tree_of "$after")

run() {  # label, tree, bench argv...
  local label=$1 dir=$2
  shift 2
  echo "## $label ($dir): $*"
  (cd "$dir" && PYTHONPATH="$dir" SANDFARM_EXEC_HELPER="$dir/.bench-sandfarm-exec" \
    "$python" "ops/bench/$1" "${@:2}") 2>&1 | grep -vE '^\s*$' | sed "s/^/$label /"
}

for bench in "${benches[@]}"; do
  read -r -a argv <<<"$bench"
  for round in 1 2; do
    run "before#$round" "$before_dir" "${argv[@]}"
    run "after#$round" "$after_dir" "${argv[@]}"
  done
done
