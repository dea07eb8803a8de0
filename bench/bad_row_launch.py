"""How long a plain launch takes to refuse a data file whose row 57 lacks the prompt
column (before the one pre-flight it took 35 s, after Ray and seven actors had started,
and printed the row four times; docs/performance-log.md section 17). The user's shape: their
own profile outside configs/, a GPT-2 with a BPE tokenizer trained here,
`question`/`answer` rows, a reward beside the profile, PYTHONPATH unset. Each repeat is a
fresh `python -m flows.ppo`, timed from the command's start to its exit;
`--validate-manifest` on the same files beside it. The load average is printed with
every figure: these machines are shared.

    .venv/bin/python -m bench.bad_row_launch               # 5 repeats of each
    .venv/bin/python -m bench.bad_row_launch --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.user_models import build_user_models
from tests.support.user_project import question_rows, write_user_project

REPO_ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 5.0


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def timed(command: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    return time.monotonic() - started, result


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bad_row_launch")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bad-row-"))
    models = build_user_models(root / "models")
    rows = question_rows(64)
    rows[57] = {"prompt": "58 plus 1?", "answer": "59"}
    profile = write_user_project(root / "mine", models.plain, rows=rows)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PREFECT_HOME"] = str(root / "prefect-home")
    commands = {
        "launch": [sys.executable, "-m", "flows.ppo", "--config", str(profile)],
        "validate-manifest": [sys.executable, "-m", "flows.ppo", "--config", str(profile), "--validate-manifest"],
    }
    print(f"profile {profile}; row 57 lacks 'question'; {args.repeats} repeats; load {load_average()}")
    ok = True
    for name, command in commands.items():
        seconds = []
        for repeat in range(args.repeats):
            elapsed, result = timed(command, env)
            seconds.append(elapsed)
            last = (result.stderr.strip().splitlines() or [""])[-1]
            print(f"  {name} #{repeat + 1}: exit {result.returncode} in {elapsed:.2f} s (load {load_average()}): "
                  f"{last[:110]}")
        started_nothing = not (root / "mine" / "outputs").exists() and not (root / "prefect-home").exists()
        median = statistics.median(seconds)
        print(f"{name}: median {median:.2f} s, max {max(seconds):.2f} s, load {load_average()}; "
              f"nothing started: {started_nothing}")
        ok = ok and started_nothing and (name != "launch" or median < TARGET_S)
    print(f"target: the launch refuses in under {TARGET_S:.0f} s at low load: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
