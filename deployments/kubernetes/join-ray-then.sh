#!/usr/bin/env bash
# join-ray-then.sh COMMAND [ARGS...]
#
# Joins the Ray cluster at RAY_ADDRESS as a node with no CPUs and no GPUs (so no role
# lands here and dies with this process), waits for its raylet and for the cluster, then
# runs COMMAND on that node (S-TEAM-2). The flow's pod in Kubernetes runs it; so can any
# host that should launch a run on a standing cluster.
#
#   RAY_ADDRESS              the cluster's GCS address, host:port (never guessed)
#   RAY_AUTH_TOKEN           the cluster's token, or
#   RAY_AUTH_TOKEN_PATH      a file holding it (a mounted Secret)
#   PPO_RAY_JOIN_TIMEOUT_S   how long joining may take (default 180)
#   PPO_RAY_NODE_TEMP_DIR    this node's Ray directory (default: a fresh one under /tmp)
#
# COMMAND runs as a child, not by exec: when it ends, this script stops the node it
# started (by pid) and exits with COMMAND's status; it stops nothing else.
set -uo pipefail

say() { echo "join-ray-then: $*" >&2; }
fail() { say "$*"; exit 2; }

[[ $# -gt 0 ]] || fail "usage: join-ray-then.sh COMMAND [ARGS...]"
address=${RAY_ADDRESS:-}
case $address in
  "") fail "RAY_ADDRESS is not set: name the Ray cluster's GCS address (host:port, e.g. ppo-ray-head-svc:6379)" ;;
  auto | local | ray://*) fail "RAY_ADDRESS=$address: name the cluster's GCS address as host:port; this script never guesses one" ;;
esac
if [[ -n ${RAY_AUTH_MODE:-} && $RAY_AUTH_MODE != token ]]; then
  fail "RAY_AUTH_MODE=$RAY_AUTH_MODE: the cluster is joined with its token; unset RAY_AUTH_MODE or set it to 'token'"
fi
if [[ -n ${RAY_AUTH_TOKEN_PATH:-} ]]; then
  [[ -s $RAY_AUTH_TOKEN_PATH && -r $RAY_AUTH_TOKEN_PATH ]] \
    || fail "RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH is not a readable, non-empty file holding the cluster's token"
elif [[ -z ${RAY_AUTH_TOKEN:-} ]]; then
  fail "no Ray token: set RAY_AUTH_TOKEN to the token of the cluster at $address, or RAY_AUTH_TOKEN_PATH to a file holding it"
fi
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=${RAY_USAGE_STATS_ENABLED:-0}

timeout_s=${PPO_RAY_JOIN_TIMEOUT_S:-180}
[[ $timeout_s =~ ^[0-9]+$ && $timeout_s -gt 0 ]] || fail "PPO_RAY_JOIN_TIMEOUT_S=$timeout_s: give a whole number of seconds"
python=${PPO_PYTHON:-python3}
made_dir=""
node_dir=${PPO_RAY_NODE_TEMP_DIR:-}
if [[ -z $node_dir ]]; then
  node_dir=$(mktemp -d /tmp/rayjoin.XXXXXX) || fail "could not make a directory for the node under /tmp"
  made_dir=$node_dir
fi
export PPO_RAY_NODE_TEMP_DIR=$node_dir  # the flow's driver attaches to this node, not another on the host
start_log=$node_dir/ray-start.log

started=$SECONDS
# --block: one process owns the node's daemons, and SIGTERM to it stops them all (and only them).
"$python" -m ray.scripts.scripts start --block --address="$address" --num-cpus=0 --num-gpus=0 \
  --temp-dir="$node_dir" --disable-usage-stats >"$start_log" 2>&1 &
ray_pid=$!

stop_node() {  # only this node's processes: `ray start`'s own, then any daemon naming its directory
  if kill -0 "$ray_pid" 2>/dev/null; then
    if [[ -s $node_dir/ray_current_cluster ]]; then
      kill -TERM "$ray_pid" 2>/dev/null  # its handler stops the node's daemons
      for _ in $(seq 1 30); do kill -0 "$ray_pid" 2>/dev/null || break; sleep 0.5; done
    fi
    kill -KILL "$ray_pid" 2>/dev/null  # still connecting: a blocked GCS call ignores SIGTERM for long
  fi
  wait "$ray_pid" 2>/dev/null
  local left
  left=$(pgrep -f -- "--temp-dir=$node_dir|$node_dir/session_" 2>/dev/null)
  [[ -n $left ]] && kill -KILL $left 2>/dev/null
  [[ -n $made_dir ]] && rm -rf "$made_dir"
  return 0
}

refuse() {  # $1: what went wrong
  local why=$1 tail
  tail=$(tail -n 5 "$start_log" 2>/dev/null)
  if grep -qiE "AuthenticationError|InvalidAuthToken|UNAUTHENTICATED" "$start_log" 2>/dev/null; then
    why="$why; the cluster refused the token: RAY_AUTH_TOKEN (or the file at RAY_AUTH_TOKEN_PATH) must be the cluster's token"
  fi
  say "could not join the Ray cluster at $address: $why"
  [[ -n $tail ]] && say "last lines of ray start:"$'\n'"$tail"
  stop_node
  exit 2
}

# Stopped while joining (the pod deleted, Ctrl-C): the node this script started goes too.
trap 'say "stopped while joining"; stop_node; exit 143' TERM
trap 'say "stopped while joining"; stop_node; exit 130' INT

# The raylet: `ray start` writes the cluster's address into the node's directory once it runs.
until [[ -s $node_dir/ray_current_cluster ]]; do
  kill -0 "$ray_pid" 2>/dev/null || refuse "ray start exited before its raylet ran"
  ((SECONDS - started < timeout_s)) || refuse "no raylet within ${timeout_s} s (PPO_RAY_JOIN_TIMEOUT_S)"
  sleep 0.5
done
# The cluster: this node registered with no capacity, and some node has room for the roles.
left=$((timeout_s - (SECONDS - started)))
((left > 0)) || refuse "no raylet within ${timeout_s} s (PPO_RAY_JOIN_TIMEOUT_S)"
if ! joined=$(timeout "$left" "$python" - "$address" "$node_dir" "$left" 2>>"$start_log" <<'PY'
import sys, time
import ray
address, node_dir, left = sys.argv[1], sys.argv[2], float(sys.argv[3])
deadline = time.monotonic() + left
ray.init(address=address, _temp_dir=node_dir, log_to_driver=False, logging_level="ERROR")
me = ray.get_runtime_context().get_node_id()
while True:
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    mine = next((node for node in nodes if node["NodeID"] == me), None)
    roomy = [node for node in nodes if node["Resources"].get("CPU", 0) > 0 or node["Resources"].get("GPU", 0) > 0]
    if mine is not None and roomy:
        break
    if time.monotonic() > deadline:
        sys.exit("the cluster has no alive node with CPUs or GPUs")
    time.sleep(1)
assert not mine["Resources"].get("CPU") and not mine["Resources"].get("GPU"), mine["Resources"]
print(f"{me} {len(nodes)}")
PY
); then
  refuse "the cluster did not answer as expected within ${timeout_s} s (PPO_RAY_JOIN_TIMEOUT_S)"
fi
read -r node_id node_count <<<"$joined"
say "node $node_id joined the Ray cluster at $address with 0 CPUs and 0 GPUs in $((SECONDS - started)) s ($node_count alive nodes); running: $*"

"$@" &
child=$!
forward() { kill -"$1" "$child" 2>/dev/null; }
trap 'forward TERM' TERM
trap 'forward INT' INT
while true; do
  wait "$child"
  status=$?
  kill -0 "$child" 2>/dev/null || break  # a signal interrupted the wait: wait again
done
trap - TERM INT
stop_node
exit "$status"
