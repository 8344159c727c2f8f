#!/usr/bin/env bash
# The main job: the example batches through a real farm, end to end.
#
#   Redis   SANDFARM_REDIS_URL (default redis://127.0.0.1:6379/0) when it answers; else a
#           private redis-server on a free port, removed afterwards.
#   worker  `sandfarm worker --backend process --concurrency 2`, in its own session.
#   batch   examples/{trajectories,humaneval,invalid}.jsonl in one run (one summary),
#           then the same command again to show resume (nothing runs twice).
#   output  results.jsonl and worker.log in SANDFARM_DEMO_OUT (default: a new temp dir, kept).
#
# Everything it started is stopped on exit: success, failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SANDFARM_BIN:-.venv/bin}
log() { echo "[demo] $*" >&2; }

url=${SANDFARM_REDIS_URL:-redis://127.0.0.1:6379/0}
out=${SANDFARM_DEMO_OUT:-$(mktemp -d /tmp/sandfarm-demo.XXXXXX)}
mkdir -p "$out"
results="$out/results.jsonl"
worker_name="demo-$$"
worker_pid=""
redis_pid=""
redis_dir=""

stop() {  # pid seconds: TERM the process (Celery: warm shutdown), then KILL its group
  local pid=$1 limit=$2 _
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq $((limit * 10))); do
    kill -0 -- "-$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  log "process group $pid still alive after ${limit}s: SIGKILL"
  kill -KILL -- "-$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  trap - EXIT
  trap '' INT TERM  # a second Ctrl-C must not leave the worker behind
  if [ -n "$worker_pid" ]; then
    log "stopping worker $worker_name (pid $worker_pid)"
    stop "$worker_pid" 20
  fi
  if [ -n "$redis_pid" ]; then
    log "stopping the private redis-server (pid $redis_pid)"
    stop "$redis_pid" 10
    rm -rf "$redis_dir"
  fi
  if [ "$rc" -ne 0 ]; then
    log "failed (exit $rc); worker log: $out/worker.log"
    [ -s "$out/worker.log" ] && tail -n 20 "$out/worker.log" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'exit 143' TERM

redis_answers() {
  "$BIN/python" - "$1" <<'EOF' 2>/dev/null
import sys
import redis
redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1, socket_timeout=2).ping()
EOF
}

wait_for() {  # seconds, description, command...
  local limit=$1 what=$2 _
  shift 2
  for _ in $(seq $((limit * 5))); do
    "$@" && return 0
    sleep 0.2
  done
  log "$what: not ready after ${limit}s"
  return 1
}

# --- Redis -------------------------------------------------------------------------------
if redis_answers "$url"; then
  log "using Redis at $url"
else
  command -v redis-server >/dev/null || { log "no Redis at $url and no redis-server (run make setup)"; exit 1; }
  port=$("$BIN/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis_dir=$(mktemp -d /tmp/sandfarm-demo-redis.XXXXXX)
  url="redis://127.0.0.1:$port/0"
  log "no Redis answers at ${SANDFARM_REDIS_URL:-redis://127.0.0.1:6379/0}: starting a private one at $url"
  setsid redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
    --dir "$redis_dir" --logfile "$redis_dir/redis.log" &
  redis_pid=$!
  wait_for 10 "redis-server" redis_answers "$url"
fi
export SANDFARM_REDIS_URL=$url

# --- worker ------------------------------------------------------------------------------
log "starting worker $worker_name (process backend, concurrency 2); log: $out/worker.log"
setsid "$BIN/sandfarm" worker --backend process --concurrency 2 --name "$worker_name" \
  --redis-url "$url" >"$out/worker.log" 2>&1 &
worker_pid=$!
worker_online() {
  kill -0 "$worker_pid" 2>/dev/null || { log "the worker exited"; exit 1; }
  "$BIN/sandfarm" status --redis-url "$url" 2>/dev/null | grep -q "$worker_name@"
}
wait_for 60 "worker $worker_name" worker_online
"$BIN/sandfarm" status --redis-url "$url"

# --- the batch ---------------------------------------------------------------------------
# Ids of lines without one derive from file name + line + content: the run prefix keeps
# this demo's jobs apart from an earlier demo's results still held (TTL) in a shared Redis.
prefix="demo-$(date +%Y%m%d%H%M%S)-$$"
inputs=(examples/trajectories.jsonl examples/humaneval.jsonl examples/invalid.jsonl)
log "batch: ${inputs[*]} -> $results"
"$BIN/sandfarm" batch run "${inputs[@]}" -o "$results" --id-prefix "$prefix" --wait-timeout 300 \
  --progress

log "the same command again: every id is already in $results, so nothing runs twice"
"$BIN/sandfarm" batch run "${inputs[@]}" -o "$results" --id-prefix "$prefix" --wait-timeout 60 \
  2>&1 | grep -E '^(resuming|[0-9]+ results|expected)'

log "done: $(wc -l <"$results") lines in $results"
