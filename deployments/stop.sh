#!/usr/bin/env bash
# Stop what deployments/serve.sh started (`make stop`): the worker first, then the
# server. The other order leaves the worker hanging on an API that is gone, and a
# flow run it was running could not report its end. Each was started with setsid, so
# its pid is also its process group; its children (a worker's flow-run processes,
# which the worker starts in their own process groups, or uvicorn under `prefect
# server start`) get SIGTERM with it, and are given the grace period to exit: a flow
# run that gets SIGTERM reports Crashed to the still-running server. Then the rest
# gets SIGKILL: the Prefect 3.9 worker turns SIGTERM into a SIGINT to itself and,
# started in the background, keeps running after it (docs/prefect-ui.md), so waiting
# for it to exit on its own would only wait.
# A Crashed run resumes from its last committed boundary on Retry in the UI, or on a
# new deployment run with the same run_name.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PPO_PYTHON:-$REPO_ROOT/.venv/bin/python}"
# PPO_PREFECT_STATE_DIR, else the stack the last `make serve` recorded, else .prefect/local
STATE_DIR="${PPO_PREFECT_STATE_DIR:-$(cd "$REPO_ROOT" && "$PYTHON" -m deployments.serve_record state-dir)}"
GRACE_SECONDS="${PPO_PREFECT_STOP_GRACE:-30}"  # for flow runs and the server to exit on SIGTERM

signal_tree() {  # signal_tree SIG PID: PID's process group and each child's own group
  local sig="$1" pid="$2" child
  for child in $(pgrep -P "$pid" || true); do
    kill "-$sig" -- "-$child" 2>/dev/null || kill "-$sig" "$child" 2>/dev/null || true
  done
  kill "-$sig" -- "-$pid" 2>/dev/null || kill "-$sig" "$pid" 2>/dev/null || true
}

followers() {  # processes of PID's tree other than PID itself: its children and its group
  { pgrep -P "$1" || true; pgrep -g "$1" || true; } | { grep -vx "$1" || true; } | sort -u
}

stop_group() {  # stop_group NAME: SIGTERM the tree in NAME.pid, SIGKILL once its followers exit
  local name="$1" pid_file="$STATE_DIR/$1.pid" pid left
  if [[ ! -f "$pid_file" ]]; then
    echo "stop: no $name pid file in $STATE_DIR"
    return 0
  fi
  pid="$(cat "$pid_file")"
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "stop: $name (pid $pid) was not running"
    rm -f "$pid_file"
    return 0
  fi
  local children
  children="$(pgrep -P "$pid" | tr '\n' ' ' || true)"
  signal_tree TERM "$pid"
  local deadline=$((SECONDS + GRACE_SECONDS))
  left="$(followers "$pid")"
  while [[ -n "$left" ]] && ((SECONDS < deadline)); do
    sleep 0.5
    left="$(followers "$pid")"
  done
  if [[ -n "$left" ]]; then
    echo "stop: $name (pid $pid): $(echo $left) still running after ${GRACE_SECONDS}s; sending SIGKILL"
  fi
  signal_tree KILL "$pid"
  for child in $children; do  # children that left the tree but outlived the grace
    kill -KILL -- "-$child" 2>/dev/null || true
  done
  for _ in $(seq 50); do  # bounded: an unreaped zombie still answers kill -0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  rm -f "$pid_file"
  echo "stop: $name (pid $pid) stopped"
}

stop_group worker
stop_group compactor
stop_group server

# The local PostgreSQL of `make serve PPO_PREFECT_DB=postgres` (S-TEAM-1), after the server
# that used it; a team's own database is never touched.
if [[ -d "$STATE_DIR/postgres/data" ]]; then
  (cd "$REPO_ROOT" && "$PYTHON" -m deployments.local_postgres stop \
    "$STATE_DIR/postgres") || exit 1
fi
