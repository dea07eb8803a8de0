"""Serve a reward model folder over HTTP with the request vLLM's `/classify` answers
(S-RM-1), so a run can score against a reward model on another machine:

    python -m models.reward_server FOLDER [--host 127.0.0.1] [--port 8000] [--name NAME]

`GET /v1/models` lists the model (with its content fingerprint); `POST /classify`
takes `{"model", "input": [text, ...], "use_activation"}` and answers
`{"data": [{"index", "label", "probs": [score], "num_classes": 1}], ...}`: the raw
logit, or its sigmoid with `use_activation` true (vLLM's default). Texts are scored
as sent (the client renders the chat template); one over the model's context is
refused with 400 naming its index, never truncated.

Loopback by default (S-SEC-1). Listening on any other address needs a token in the
environment variable PPO_REWARD_SERVER_TOKEN, required of every request as
`Authorization: Bearer <token>` (vLLM's `--api-key` convention); it is read from the
environment, never the command line, which other users of the machine can see.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

TOKEN_ENV = "PPO_REWARD_SERVER_TOKEN"
MAX_BODY_BYTES = 64 << 20


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RewardModelService:
    """The loaded model, scoring one request at a time (a forward is not thread-safe
    to interleave with another on the same module)."""

    def __init__(self, folder: str, name: str, dtype: str = "float32", batch_size: int = 32):
        from models.fingerprint import fingerprint_folder
        from models.reward_model import LocalScorer, RewardText

        self.name = name
        self.fingerprint = fingerprint_folder(folder).digest
        self.scorer = LocalScorer(RewardText(folder, max_length=self._context(folder)), dtype, batch_size)
        self.lock = threading.Lock()

    @staticmethod
    def _context(folder: str) -> int:
        from transformers import AutoConfig

        return int(getattr(AutoConfig.from_pretrained(folder), "max_position_embeddings", None) or 1 << 20)

    def classify(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return 400, {"error": "input must be a string or a non-empty list of strings"}
        model = body.get("model")
        if model is not None and model != self.name:
            return 404, {"error": f"model {model!r} is not served here (serving {self.name!r})"}
        special = bool(body.get("add_special_tokens", True))  # vLLM's default: added unless the request says not
        text = self.scorer.text
        encoded = text.tokenizer(texts, add_special_tokens=special)["input_ids"]
        for index, ids in enumerate(encoded):
            if len(ids) > text.max_length:
                return 400, {"error": f"input[{index}] is {len(ids)} tokens, over the model's context of "
                                      f"{text.max_length}; it is not truncated"}
        with self.lock:
            scores = self.scorer.score_ids(encoded)
        if body.get("use_activation", True):
            scores = torch.sigmoid(scores)
        data = [{"index": i, "label": None, "probs": [float(s)], "num_classes": 1} for i, s in enumerate(scores)]
        tokens = sum(len(ids) for ids in encoded)
        return 200, {
            "id": f"classify-{time.time_ns()}", "object": "list", "created": int(time.time()), "model": self.name,
            "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.name, "object": "model", "fingerprint": self.fingerprint}]}


def make_handler(service: RewardModelService, token: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "ppo-reward-server"

        def log_message(self, format: str, *args: Any) -> None:  # one line per request on stderr, no bodies
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

        def _authorised(self) -> bool:
            if token is None:
                return True
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return True
            self._answer(401, {"error": "missing or wrong bearer token"})
            return False

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if not self._authorised():
                return
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._answer(200, service.models())
            elif self.path == "/health":
                self._answer(200, {"status": "ok"})
            else:
                self._answer(404, {"error": f"no such endpoint {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorised():
                return
            if self.path.rstrip("/") not in ("/classify", "/v1/classify"):
                self._answer(404, {"error": f"no such endpoint {self.path}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._answer(413, {"error": f"request body over {MAX_BODY_BYTES} bytes"})
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError as error:
                self._answer(400, {"error": f"body is not JSON: {error}"})
                return
            if not isinstance(body, dict):
                self._answer(400, {"error": "body must be a JSON object"})
                return
            try:
                status, answer = service.classify(body)
            except Exception as error:  # the model failed: the client retries a 500
                status, answer = 500, {"error": f"{type(error).__name__}: {error}"}
            self._answer(status, answer)

    return Handler


class UnsafeListen(ValueError):
    """Listening beyond loopback without a token (S-SEC-1)."""


def serve(
    folder: str, host: str, port: int, name: str, token: str | None, dtype: str = "float32"
) -> ThreadingHTTPServer:
    """A started server (its thread serving) on (host, port); port 0 picks a free one."""
    if not is_loopback(host) and not token:
        raise UnsafeListen(
            f"--host {host} listens beyond loopback; set {TOKEN_ENV} to a token every request must carry "
            "or keep the default --host 127.0.0.1"
        )
    service = RewardModelService(folder, name, dtype)
    server = ThreadingHTTPServer((host, port), make_handler(service, token))
    thread = threading.Thread(target=server.serve_forever, name="reward-server", daemon=True)
    thread.start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.reward_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a one-label sequence-classification model folder (and its tokenizer)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free one, printed)")
    parser.add_argument("--name", default=None, help="the model name requests use (default: the folder's name)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = parser.parse_args(argv)
    from models.reward_model import RewardModelError

    try:
        server = serve(args.folder, args.host, args.port, args.name or os.path.basename(args.folder.rstrip("/")),
                       os.environ.get(TOKEN_ENV) or None, args.dtype)
    except (RewardModelError, UnsafeListen) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    print(f"serving {args.folder} at http://{host}:{port} (POST /classify, GET /v1/models)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
