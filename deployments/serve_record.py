"""Where the local Prefect stack of `make serve` lives, found again by the commands
that use it (`make deploy`, `make watch`, `make stop`, `make serve` run again) without
repeating PPO_PREFECT_STATE_DIR.

serve.sh writes the record (default `.prefect/serve.json` in the repository, ignored by
git; another file with PPO_PREFECT_SERVE_RECORD) once its server answers: the state
directory and the API's URL. A command then finds the stack as follows: the
PPO_PREFECT_STATE_DIR it was given, else the recorded one, else `.prefect/local`.

    python -m deployments.serve_record write STATE_DIR API_URL
    python -m deployments.serve_record state-dir   # the stack's state directory (running or not)
    python -m deployments.serve_record env-file    # its env.sh, or exit 2 saying why there is none to use
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

REPO_ROOT = Path(__file__).resolve().parent.parent
STATE_DIR_ENV = "PPO_PREFECT_STATE_DIR"
RECORD_ENV = "PPO_PREFECT_SERVE_RECORD"
DEFAULT_STATE_DIR = REPO_ROOT / ".prefect" / "local"
DEFAULT_RECORD = REPO_ROOT / ".prefect" / "serve.json"


class NoStack(Exception):
    """No stack to use: the message says which directory was looked at and what to run."""


@dataclass(frozen=True)
class FoundStack:
    state_dir: Path
    how: str  # how it was found, for the messages: "PPO_PREFECT_STATE_DIR", the record's path, or "the default"
    api_url: str | None = None

    @property
    def env_file(self) -> Path:
        return self.state_dir / "env.sh"


def record_path(environ: Mapping[str, str]) -> Path:
    return Path(environ[RECORD_ENV]) if environ.get(RECORD_ENV) else DEFAULT_RECORD


def write(path: Path, state_dir: Path, api_url: str) -> None:
    """Written aside and renamed, so a reader never sees half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"state_dir": str(state_dir.resolve()), "api_url": api_url, "written_at": time.time()}
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, path)


def read(path: Path) -> dict | None:
    """The record, or None when there is none; a record that does not parse names its file."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise NoStack(f"{path}: not a record of `make serve` ({error}); delete it and run make serve") from error
    if not isinstance(record, dict) or not isinstance(record.get("state_dir"), str):
        raise NoStack(f"{path}: not a record of `make serve` (no state_dir); delete it and run make serve")
    return record


def find(environ: Mapping[str, str]) -> FoundStack:
    """The stack a command means: the directory it was given, else the recorded one, else the default."""
    if environ.get(STATE_DIR_ENV):
        return FoundStack(Path(environ[STATE_DIR_ENV]), STATE_DIR_ENV)
    path = record_path(environ)
    record = read(path)
    if record is not None:
        return FoundStack(Path(record["state_dir"]), str(path), record.get("api_url"))
    return FoundStack(DEFAULT_STATE_DIR, "the default")


def running(stack: FoundStack) -> FoundStack:
    """`stack` when its server is up; else NoStack naming the directory and what to run."""
    where = str(stack.state_dir) + {STATE_DIR_ENV: f" ({STATE_DIR_ENV})", "the default": ""}.get(
        stack.how, f" (recorded in {stack.how})")
    if not stack.env_file.is_file():
        raise NoStack(f"no local Prefect stack at {where}: run make serve first")
    pid_file = stack.state_dir / "server.pid"
    pid = _pid(pid_file)
    if pid is None or not _alive(pid):
        url = f" at {stack.api_url}" if stack.api_url else ""
        raise NoStack(f"the Prefect server of the stack at {where}{url} is not running: run make serve "
                      f"(PPO_PREFECT_STATE_DIR={stack.state_dir} keeps its runs and deployments)")
    return stack


def _pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.serve_record", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writing = commands.add_parser("write", help="record the stack serve.sh brought up")
    writing.add_argument("state_dir", type=Path)
    writing.add_argument("api_url")
    commands.add_parser("state-dir", help="print the stack's state directory")
    commands.add_parser("env-file", help="print the running stack's env.sh")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "write":
            write(record_path(os.environ), args.state_dir, args.api_url)
        elif args.command == "state-dir":
            print(find(os.environ).state_dir)
        else:
            print(running(find(os.environ)).env_file)
    except NoStack as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
