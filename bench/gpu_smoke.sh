#!/usr/bin/env bash
# GPU smoke test: the device each role's actor actually holds its model on, then a few
# PPO iterations of the tiny profile with GPU placement and the HF rollout engine, then
# the per-stage times and the policy's park cost (S-RUN-4). One command, under 5 minutes:
#
#   bench/gpu_smoke.sh [ITERATIONS] [-- key=value ...]   (default 5; PY=/path/to/python to choose the interpreter)
#
# Overrides after `--` are added last, e.g. `-- grid.cpu_trainer_ranks=2` gives the
# host-side critic two data-parallel ranks on a one- or two-GPU node.
#
# Needs a CUDA GPU visible to torch and the project installed (make setup, or
# requirements.lock on the node). Placement follows S-RUN-4: with 3+ GPUs the real
# colocated layout (policy+rollout on N-2 GPUs, one each for reference and critic);
# with 1-2 GPUs policy+rollout get GPU 0 and reference/critic stay on the host.
# Outputs go to a fresh temp folder, printed at the end. Exit status: the flow's.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
ITERATIONS=5
if [ $# -gt 0 ] && [ "$1" != "--" ]; then ITERATIONS=$1; shift; fi
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
BUDGET_S=${GPU_SMOKE_BUDGET_S:-220}  # the flow's share; the device probe gets at most 70 s more

GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$GPUS" -lt 1 ]; then
    echo "gpu_smoke: torch $("$PY" -c 'import torch; print(torch.__version__)') sees no CUDA GPU; nothing to smoke-test" >&2
    exit 2
fi
echo "gpu_smoke: $GPUS GPU(s) visible to torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)')"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

if [ "$GPUS" -ge 3 ]; then
    PLACEMENT=(grid.gpus_per_node="$GPUS" grid.policy_gpus=$((GPUS - 2)) grid.reference_gpus=1 grid.critic_gpus=1)
else
    PLACEMENT=(grid.gpus_per_node=1 grid.policy_gpus=1 grid.reference_gpus=0 grid.critic_gpus=0)
fi
OUT=$(mktemp -d /tmp/ppo-gpu-smoke.XXXXXX)
export PREFECT_HOME="$OUT/prefect" RAY_TMPDIR="${RAY_TMPDIR:-/tmp/ray}"
OVERRIDES=(job.output_root="$OUT" job.name=gpu-smoke rl.max_steps="$ITERATIONS" rl.save_every=0 rl.save_final=false
           grid.ray_num_cpus=null "${PLACEMENT[@]}" "${EXTRA[@]}")

echo "gpu_smoke: placement ${PLACEMENT[*]}"
"$PY" -m cli.manifest --config configs/ppo_tiny_cpu.py -- "${OVERRIDES[@]}"

# The same actors the flow starts, asked where their models live: each role's ready()
# reports the device it computes on (and the policy whether it is parked on the host).
if timeout 70 "$PY" - "${OVERRIDES[@]}" <<'PROBE'
import sys

import ray

from flows.training import resolve_config
from processes.actors import start_role_actors, stop_role_actors
from processes.ray_session import connect_ray

config = resolve_config("configs/ppo_tiny_cpu.py", sys.argv[1:] + ["job.name=gpu-smoke-probe"], None, None)
started, roles = connect_ray(config), None
try:
    roles = start_role_actors(config)
    print("gpu_smoke: role devices")
    for name, _ in roles.items():
        for rank, handle in enumerate(roles.ranks(name)):  # data-parallel trainers: every rank
            print(f"  {name + (f' #{rank}' if rank else ''):<12} {ray.get(handle.ready.remote())}")
finally:
    stop_role_actors(roles)
    if started:
        ray.shutdown()
PROBE
then :; else echo "gpu_smoke: device probe failed (status $?); running the flow anyway" >&2; fi

started=$(date +%s)
status=0
timeout "$BUDGET_S" "$PY" -m flows.ppo --config configs/ppo_tiny_cpu.py --fresh -- "${OVERRIDES[@]}" || status=$?
echo "gpu_smoke: flow finished with status $status in $(( $(date +%s) - started )) s (budget ${BUDGET_S} s)"

"$PY" - "$OUT/gpu-smoke/metrics.jsonl" <<'EOF'
"""Per-stage seconds: iteration 1 (start-up effects) and the median of the rest."""
import json
import statistics
import sys
from pathlib import Path

path = Path(sys.argv[1])
if not path.exists():
    sys.exit(f"gpu_smoke: no metrics at {path}")
records = [json.loads(line) for line in path.read_text().splitlines()]
stages = sorted({k for r in records for k in r if k.startswith("time/")}, key=lambda k: (k == "time/iteration_seconds", k))
print(f"\n{'stage':<28}{'iter 1':>10}{'median 2..' + str(len(records)):>16}")
for key in stages:
    first = records[0].get(key)
    rest = [r[key] for r in records[1:] if key in r]
    median = f"{statistics.median(rest):.3f}" if rest else "-"
    print(f"{key.removeprefix('time/').removesuffix('_seconds'):<28}{(f'{first:.3f}' if first is not None else '-'):>10}{median:>16}")
last = records[-1]
print(f"\niterations {len(records)}, reward {records[0]['train/reward_mean']:.3f} -> {last['train/reward_mean']:.3f}, "
      f"weight_sync {last.get('perf/weight_sync_bytes', 0) / 1e6:.2f} MB in {last.get('time/weight_sync_seconds', 0):.3f} s")
if "perf/policy_parked_bytes" in last:  # S-RUN-4: absent when the policy does not park
    print(f"policy park: {last['perf/policy_parked_bytes'] / 1e6:.2f} MB to the host in "
          f"{last['perf/policy_park_seconds']:.3f} s (inside weight_sync)")
else:
    print("policy park: none (the policy does not share a GPU with the rollout, or rl.colocated_offload=false)")
EOF
echo "gpu_smoke: outputs in $OUT"
exit "$status"
