"""What deployments/serve.sh asks while it brings the local stack up, as one program:
whether the server answers, whether its port is free, and a server log's tail with any
database password masked.

    python -m deployments.stack_checks healthy URL          # exit 0 when URL answers
    python -m deployments.stack_checks port-free HOST PORT  # exit 0 when HOST:PORT can be bound
    python -m deployments.stack_checks masked-tail FILE     # its last 20 lines on stderr, password masked
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import urllib.request
from collections import deque
from pathlib import Path
from urllib.parse import unquote, urlsplit

DATABASE_URL_ENV = "PPO_DATABASE_URL"  # the URL whose password must never reach the terminal


def healthy(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).read()
    except Exception:  # noqa: BLE001  (any failure means: not yet)
        return False
    return True


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # As the server will: a port a stopped server left in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def masked(lines: list[str], database_url: str | None) -> list[str]:
    """`lines` with the URL's password (as written and percent-decoded) replaced by ***."""
    secret = urlsplit(database_url).password if database_url else None
    if not secret:
        return lines
    return [line.replace(secret, "***").replace(unquote(secret), "***") for line in lines]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.stack_checks")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("healthy").add_argument("url")
    free = commands.add_parser("port-free")
    free.add_argument("host")
    free.add_argument("port", type=int)
    commands.add_parser("masked-tail").add_argument("file", type=Path)
    args = parser.parse_args(argv)
    if args.command == "healthy":
        return 0 if healthy(args.url) else 1
    if args.command == "port-free":
        return 0 if port_free(args.host, args.port) else 1
    with args.file.open(errors="replace") as log:
        tail = list(deque(log, maxlen=20))
    sys.stderr.writelines(masked(tail, os.environ.get(DATABASE_URL_ENV)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
