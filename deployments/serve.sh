#!/usr/bin/env bash
# Bring up the local Prefect stack for the ppo deployments (`make serve`):
#   1. `prefect server start` on 127.0.0.1:$PPO_PREFECT_PORT (default 4200), its
#      database under the state directory (PREFECT_HOME); another address
#      (PPO_PREFECT_HOST) only with PREFECT_SERVER_API_AUTH_STRING set (S-SEC-1),
#   2. the `ppo-process` work pool (type process),
#   3. both deployments from deployments/prefect.yaml (ppo/public-4gpu, ppo/tiny-cpu)
#      and the automation that resumes their crashed runs (deployments/automations.yaml),
#   4. a worker polling the pool (and, beside the server, the history compactor).
# The database (S-TEAM-1): SQLite under PREFECT_HOME by default (one person); the
# PostgreSQL that PREFECT_SERVER_DATABASE_CONNECTION_URL names (a team's); or, with
# PPO_PREFECT_DB=postgres, a local PostgreSQL 15 cluster this script starts under
# $PPO_PREFECT_STATE_DIR/postgres (loopback, a generated password kept in a 0600 file and
# handed to the server's environment only). A database that is down or refuses the
# password fails here, naming host and port, before the server starts.
# Pids and logs go to $PPO_PREFECT_STATE_DIR (default .prefect/local); stop it all
# with deployments/stop.sh (`make stop`: worker first, then server). Running this
# again with the stack up redeploys and leaves running processes alone. The state
# directory and the API's URL are recorded (.prefect/serve.json) for the commands
# run after it without PPO_PREFECT_STATE_DIR (deployments/serve_record.py).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

PYTHON="${PPO_PYTHON:-$REPO_ROOT/.venv/bin/python}"
# PPO_PREFECT_STATE_DIR, else the stack the last `make serve` recorded, else .prefect/local
STATE_DIR="${PPO_PREFECT_STATE_DIR:-$("$PYTHON" -m deployments.serve_record state-dir)}"
HOST="${PPO_PREFECT_HOST:-127.0.0.1}"
PORT="${PPO_PREFECT_PORT:-4200}"
POOL="ppo-process"
STARTUP_TIMEOUT="${PPO_PREFECT_STARTUP_TIMEOUT:-180}"

# S-SEC-1: whoever reaches the API can run deployments (code) on the worker, so an
# address beyond loopback needs the server's basic-auth string. Checked before
# anything is written or started.
if ! [[ "$HOST" =~ ^(127\.[0-9]+\.[0-9]+\.[0-9]+|localhost|::1)$ ]]; then
  if [[ -z "${PREFECT_SERVER_API_AUTH_STRING:-}" ]]; then
    echo "serve: PPO_PREFECT_HOST=$HOST is not a loopback address; set PREFECT_SERVER_API_AUTH_STRING=user:password" \
      "to require authentication, or leave PPO_PREFECT_HOST unset (127.0.0.1)" >&2
    exit 2
  fi
  if [[ "$PREFECT_SERVER_API_AUTH_STRING" != *:* ]]; then
    echo "serve: PREFECT_SERVER_API_AUTH_STRING must have the form user:password" >&2
    exit 2
  fi
fi
case "$HOST" in  # the address clients use: a wildcard bind is reached on loopback
  0.0.0.0) CLIENT_HOST=127.0.0.1 ;;
  ::|::1) CLIENT_HOST="[::1]" ;;
  *:*) CLIENT_HOST="[$HOST]" ;;
  *) CLIENT_HOST="$HOST" ;;
esac
API_URL="http://${CLIENT_HOST}:${PORT}/api"

mkdir -p "$STATE_DIR/home"
# The server and Ray tuning the CLI run applies too (cli/environment.py).
TUNING="$("$PYTHON" -m cli.environment --export-tuning)"
# Everything below (server, CLI, worker, the flow runs the worker starts) shares
# this environment; env.sh (POSIX sh: make's recipes source it) lets a user's shell talk to the same server.
cat > "$STATE_DIR/env.sh" <<EOF
export PATH="$(dirname "$PYTHON"):\$PATH"
export PREFECT_HOME="$STATE_DIR/home"
export PREFECT_API_URL="$API_URL"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
export RAY_USAGE_STATS_ENABLED="\${RAY_USAGE_STATS_ENABLED:-0}"
export TOKENIZERS_PARALLELISM=false
export PPO_TASK_HISTORY="${PPO_TASK_HISTORY:-compact}"
# The server's auth string, when set, is what the CLI and the worker authenticate
# with; read from the environment when sourced, never written to this file.
if [ -n "\${PREFECT_SERVER_API_AUTH_STRING:-}" ]; then export PREFECT_API_AUTH_STRING="\$PREFECT_SERVER_API_AUTH_STRING"; fi
$TUNING
EOF
# shellcheck source=/dev/null
source "$STATE_DIR/env.sh"

prefect_cli() { "$PYTHON" -m prefect "$@"; }

alive() {  # alive NAME: the pid in NAME.pid is a running process
  local pid_file="$STATE_DIR/$1.pid"
  [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null
}

api_healthy() { "$PYTHON" -m deployments.stack_checks healthy "$API_URL/health"; }

port_free() { "$PYTHON" -m deployments.stack_checks port-free "$HOST" "$PORT"; }

# 0. the database (S-TEAM-1)
DB_KIND="${PPO_PREFECT_DB:-sqlite}"
PG_DIR="$STATE_DIR/postgres"
case "$DB_KIND" in
  sqlite | postgres) ;;
  *) echo "serve: PPO_PREFECT_DB=$DB_KIND: choose sqlite (the default) or postgres" >&2; exit 2 ;;
esac
if [[ "$DB_KIND" == postgres && -n "${PREFECT_SERVER_DATABASE_CONNECTION_URL:-}" ]]; then
  echo "serve: PPO_PREFECT_DB=postgres starts a local PostgreSQL; PREFECT_SERVER_DATABASE_CONNECTION_URL names" \
    "another database: set one of them" >&2
  exit 2
fi

DATABASE_URL="${PREFECT_SERVER_DATABASE_CONNECTION_URL:-}"
if [[ "$DB_KIND" == postgres ]]; then
  # Started (or found running) and checked by deployments/local_postgres.py, which stops a
  # cluster it started when its database does not answer; its URL holds the password.
  DATABASE_URL="$("$PYTHON" -m deployments.local_postgres start "$PG_DIR" --timeout "$STARTUP_TIMEOUT")" || exit $?
elif ! alive server; then  # SQLite too: a database written by a newer Prefect is named here
  PREFECT_SERVER_DATABASE_CONNECTION_URL="$DATABASE_URL" "$PYTHON" -m deployments.database check || exit 1
fi

# 1. server (setsid: its own process group, so stop.sh can end it and its children)
if alive server; then
  echo "serve: server already running (pid $(cat "$STATE_DIR/server.pid")) at $API_URL"
else
  if ! port_free; then
    echo "serve: port $PORT on $HOST is in use; choose another with PPO_PREFECT_PORT=NNNN" >&2
    exit 1
  fi
  # The server streams each flow run's logs out as they arrive: without it (Prefect's
  # default), `prefect deployment run --watch` shows only state changes, never a run's
  # `error:` line. The database URL (it may hold a password) goes to the server's
  # environment only, never to env.sh or a log.
  export PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED=true PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED=true
  if [[ -n "$DATABASE_URL" ]]; then
    PREFECT_SERVER_DATABASE_CONNECTION_URL="$DATABASE_URL" setsid "$PYTHON" -m prefect server start --host "$HOST" \
      --port "$PORT" >"$STATE_DIR/server.log" 2>&1 </dev/null &
  else
    setsid "$PYTHON" -m prefect server start --host "$HOST" --port "$PORT" \
      >"$STATE_DIR/server.log" 2>&1 </dev/null &
  fi
  echo $! >"$STATE_DIR/server.pid"
  echo "serve: starting server (pid $!), log $STATE_DIR/server.log"
fi
deadline=$((SECONDS + STARTUP_TIMEOUT))
until api_healthy; do
  if ! alive server; then
    echo "serve: the server exited; last lines of $STATE_DIR/server.log:" >&2
    # A database password never reaches the terminal, whatever the server logged.
    PPO_DATABASE_URL="$DATABASE_URL" "$PYTHON" -m deployments.stack_checks masked-tail "$STATE_DIR/server.log"
    exit 1
  fi
  if ((SECONDS > deadline)); then
    echo "serve: server not healthy after ${STARTUP_TIMEOUT}s (PPO_PREFECT_STARTUP_TIMEOUT); see $STATE_DIR/server.log" >&2
    exit 1
  fi
  sleep 1
done
echo "serve: server healthy at $API_URL"
# Where this stack is, for `make deploy`, `make stop` and `make watch` run without
# PPO_PREFECT_STATE_DIR (deployments/serve_record.py).
"$PYTHON" -m deployments.serve_record write "$STATE_DIR" "$API_URL"

# 2. work pool
if prefect_cli work-pool inspect "$POOL" >/dev/null 2>&1; then
  echo "serve: work pool $POOL exists"
else
  prefect_cli work-pool create "$POOL" --type process >"$STATE_DIR/deploy.log" 2>&1
  echo "serve: created work pool $POOL"
fi

# 3. deployments (from the repository root: entrypoints and the pull step's
#    working directory are resolved against it)
if ! prefect_cli --no-prompt deploy --all --prefect-file deployments/prefect.yaml >>"$STATE_DIR/deploy.log" 2>&1; then
  echo "serve: prefect deploy failed; see $STATE_DIR/deploy.log" >&2
  tail -n 20 "$STATE_DIR/deploy.log" >&2
  exit 1
fi
echo "serve: deployed ppo/public-4gpu and ppo/tiny-cpu"

# 3b. the automation that reschedules crashed runs of `auto-resume` deployments
#     (deployments/automations.yaml; S-FAULT-5)
if prefect_cli automation inspect ppo-resume-crashed-runs >/dev/null 2>&1; then
  echo "serve: automation ppo-resume-crashed-runs exists"
elif prefect_cli automation create --from-file deployments/automations.yaml >>"$STATE_DIR/deploy.log" 2>&1; then
  echo "serve: created automation ppo-resume-crashed-runs (crashed runs resume by themselves)"
else
  echo "serve: creating the automation failed; see $STATE_DIR/deploy.log" >&2
  tail -n 20 "$STATE_DIR/deploy.log" >&2
  exit 1
fi

# 3c. the history compactor (S-FOOT-1): a finished block's completed task runs keep their
#     final state only; beside the server, the one process that holds the database's URL
#     (deployments/history_compactor.py; PPO_TASK_HISTORY=full keeps every state)
if alive compactor; then
  echo "serve: history compactor already running (pid $(cat "$STATE_DIR/compactor.pid"))"
else
  if [[ -n "$DATABASE_URL" ]]; then
    PREFECT_SERVER_DATABASE_CONNECTION_URL="$DATABASE_URL" setsid "$PYTHON" -m deployments.history_compactor \
      >"$STATE_DIR/compactor.log" 2>&1 </dev/null &
  else
    setsid "$PYTHON" -m deployments.history_compactor >"$STATE_DIR/compactor.log" 2>&1 </dev/null &
  fi
  echo $! >"$STATE_DIR/compactor.pid"
  echo "serve: started the history compactor (pid $!), log $STATE_DIR/compactor.log"
fi

# 4. worker
if alive worker; then
  echo "serve: worker already running (pid $(cat "$STATE_DIR/worker.pid"))"
else
  setsid "$PYTHON" -m prefect worker start --pool "$POOL" --type process \
    >"$STATE_DIR/worker.log" 2>&1 </dev/null &
  echo $! >"$STATE_DIR/worker.pid"
  echo "serve: started worker (pid $!), log $STATE_DIR/worker.log"
fi

cat <<EOF

Prefect UI: http://${CLIENT_HOST}:${PORT}
Run from a shell:
  source $STATE_DIR/env.sh
  prefect deployment run ppo/tiny-cpu --watch
  prefect deployment run ppo/tiny-cpu --param 'overrides=["rl.max_steps=5"]' --param run_name=try1 --watch
Why a run ended (its error: lines): make watch RUN=try1
Your own profile: make deploy PROFILE=my-project/my_profile.py NAME=my-name
Stop: make stop   (or deployments/stop.sh)
EOF
