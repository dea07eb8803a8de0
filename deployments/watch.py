"""`python -m deployments.watch [RUN]` (`make watch RUN=...`): follow a deployment's
flow run to its end and end on why it ended, as the command line does.

`prefect deployment run --watch` ends on the state's name alone ("Flow run finished in
state 'Failed'"), and shows the run's logs only where the server streams them out
(`make serve` has it do so; a server of Prefect's defaults does not). This reads the
logs and the state through the API, which every server answers: it prints the logs
as they arrive, then the run's own `error:` lines (or the state's message when the
run never logged any) and exits 0 for Completed, 1 otherwise.

RUN is a flow run's id or its name (the `run_name`; the newest run of that name);
without it, the newest run of the `ppo` flow.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

PREFECT_PREFIX = "Flow run encountered an exception: "  # what Prefect puts before a raised error's text
ERROR_LEVEL = 40
RECENT_RUNS = 50  # searched for a run_name parameter when no run has that name yet
ALREADY_ENDED_TAIL = 10  # log lines shown of a run that had ended before it was watched


@dataclass(frozen=True)
class LogLine:
    level: int
    message: str


def ending(state_type: str, state_name: str, message: str | None, logs: Sequence[LogLine]) -> tuple[list[str], int]:
    """The lines a followed run ends on, and the exit code. A failed run's cause is the
    `error:` lines the flow logged last (S-BYO-2); without them (a crash, an error the
    flow does not know), the state's message and the last ERROR logs' last lines, where
    a traceback ends on its exception."""
    message = (message or "").strip()
    if state_type == "COMPLETED":
        return [f"done: {state_name}" + (f": {message}" if message else "")], 0
    if state_type == "CANCELLED":
        return [f"cancelled: {message or state_name}"], 1
    errors = [log.message.strip() for log in logs if log.level >= ERROR_LEVEL and log.message.strip()]
    own = [text for text in errors if text.startswith("error: ")]
    if own:
        return [f"{state_name}:", *own[-1].splitlines()], 1
    cause = message[len(PREFECT_PREFIX):] if message.startswith(PREFECT_PREFIX) else message
    lines = [f"{state_name}:", f"error: {cause or 'the run ended ' + state_name + ' without a message'}"]
    lasts = [text.splitlines()[-1] for text in errors[-3:]]
    lines += [f"  log: {last}" for last in lasts if last not in cause]
    return lines, 1


def find_flow_run(client: Any, run: str | None) -> Any:
    """The flow run `run` names (an id, or the newest run of that name), or the newest
    run of the `ppo` flow; a LookupError says what was looked for."""
    from prefect.client.schemas.filters import (
        FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterName, FlowRunFilterParentTaskRunId,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    if run:
        try:
            return client.read_flow_run(uuid.UUID(run))
        except ValueError:
            pass  # not an id: a name
    def newest(limit: int, **by_name: Any) -> list[Any]:
        top_level = FlowRunFilterParentTaskRunId(is_null_=True)  # not a block's subflow
        return client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["ppo"])),
            flow_run_filter=FlowRunFilter(parent_task_run_id=top_level, **by_name),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=limit,
        )

    if not run:
        runs = newest(1)
        if not runs:
            raise LookupError("no flow run of the ppo flow yet")
        return runs[0]
    runs = newest(1, name=FlowRunFilterName(any_=[run]))
    if runs:
        return runs[0]
    # A run that has not started yet carries Prefect's generated name; its run_name is a parameter.
    for candidate in newest(RECENT_RUNS):
        if (candidate.parameters or {}).get("run_name") == run:
            return candidate
    raise LookupError(f"no flow run of the ppo flow named {run!r} (nor with run_name {run!r} among the last "
                      f"{RECENT_RUNS}); `prefect flow-run ls --flow-name ppo` lists them")


def follow(
    client: Any, flow_run: Any, say: Callable[[str], None], poll_s: float = 2.0, timeout_s: float | None = None,
    settle_s: float = 3.0,
) -> tuple[Any, list[LogLine]]:
    """Print the run's state changes and logs until it is final (then its last logs,
    which may arrive a little after the state), and return it with every log read."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id]))
    logs: list[LogLine] = []
    seen_state, ended_at = None, None
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    ended_before = flow_run.state is not None and flow_run.state.is_final()
    while True:
        new: list[str] = []
        while page := client.read_logs(log_filter=log_filter, offset=len(logs), limit=200, sort=LogSort.TIMESTAMP_ASC):
            for log in page:
                logs.append(LogLine(log.level, log.message))
                new.append(f"{log.timestamp:%H:%M:%S} {_level_name(log.level):7} {shown(log.message)}")
        if ended_before and len(new) > ALREADY_ENDED_TAIL:  # a run that ended before: its last lines only
            say(f"(the run had ended; its last {ALREADY_ENDED_TAIL} of {len(new)} log lines)")
            new = new[-ALREADY_ENDED_TAIL:]
        for line in new:
            say(line)
        flow_run = client.read_flow_run(flow_run.id)
        state = flow_run.state
        if state is not None and state.name != seen_state:
            seen_state = state.name
            say(f"state: {state.name}")
        if state is not None and state.is_final():
            if ended_at is None:
                ended_at = time.monotonic()
            elif time.monotonic() - ended_at >= settle_s:
                return flow_run, logs
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"the flow run did not end within {timeout_s:.0f} s (--timeout)")
        time.sleep(poll_s if ended_at is None else min(poll_s, settle_s))


def shown(message: str) -> str:
    """A log message as printed: a traceback as its first and last lines (the UI and
    `prefect flow-run logs` keep it whole), anything else as it is."""
    lines = message.rstrip().splitlines()
    if len(lines) > 2 and any(line.startswith("Traceback (most recent call last)") for line in lines):
        return f"{lines[0]}\n    ... {lines[-1].strip()}"
    return message


def _level_name(level: int) -> str:
    import logging

    return logging.getLevelName(level)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.watch", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", help="a flow run's id or name (default: the newest run of the ppo flow)")
    parser.add_argument("--timeout", type=float, default=None, help="stop following after this many seconds")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        try:
            flow_run = find_flow_run(client, args.run)
        except LookupError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"watch: flow run {flow_run.name} ({flow_run.id})", flush=True)
        try:
            flow_run, logs = follow(client, flow_run, lambda line: print(line, flush=True), timeout_s=args.timeout)
        except TimeoutError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    state = flow_run.state
    lines, code = ending(state.type.value, state.name, state.message, logs)
    print("\n".join(lines), file=sys.stdout if code == 0 else sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
