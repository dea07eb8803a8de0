"""A served reward model's client (S-RM-1, `rl.reward.model.url`).

The request is vLLM's classification API: `POST {url}/classify` with
`{"model": name, "input": [text, ...], "use_activation": false, "add_special_tokens": ...}`
(`ClassificationCompletionRequest` of vLLM 0.32.0, the version requirements-gpu.lock pins) answered by
`{"data": [{"index": i, "probs": [score], ...}]}`; `use_activation: false` asks for
the raw logit (a one-label classifier's default activation is a sigmoid). Our own
server (`python -m models.reward_server`) answers the same request, so one client
serves both. `GET {url}/v1/models` is the pre-flight's "does it answer".

Batched (`batch_size` texts per request), each request bounded by `timeout_seconds`,
retried `retries` times with exponential backoff on what can pass (a refused or reset
connection, a timeout, 429 and 5xx); a failure names the endpoint and the status.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from configs.schema import RewardModelConfig
from contracts.faults import RepeatsOnRerun

TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
FIRST_BACKOFF_S = 0.5


class RewardServerError(RuntimeError):
    """The served reward model did not answer as asked (a dead server may come back:
    this one ends with the resume hint)."""


class RewardServerRefused(RewardServerError, RepeatsOnRerun):
    """The server answered with a refusal a rerun would repeat (401, 400, 404...)."""


@dataclass
class RewardClient:
    url: str
    served_name: str | None
    token: str | None
    timeout_seconds: float
    retries: int
    batch_size: int

    @classmethod
    def from_config(cls, settings: RewardModelConfig) -> "RewardClient":
        token = None
        if settings.token_env is not None:
            token = os.environ.get(settings.token_env)
            if not token:
                raise RewardServerRefused(
                    f"rl.reward.model.token_env: the environment variable {settings.token_env} is unset or empty; "
                    "it must hold the reward server's token"
                )
        assert settings.url is not None
        return cls(settings.url.rstrip("/"), settings.served_name, token, settings.timeout_seconds,
                   settings.retries, settings.batch_size)

    def check(self) -> str:
        """What the server serves, in words; raises naming the endpoint when it does not answer."""
        listed = self._request("GET", "/v1/models", None, retries=0)
        names = [str(model.get("id")) for model in listed.get("data") or [] if isinstance(model, dict)]
        if self.served_name is not None and self.served_name not in names:
            raise RewardServerRefused(
                f"{self.url}/v1/models lists {', '.join(names) or 'no model'}, not rl.reward.model.served_name="
                f"{self.served_name!r}"
            )
        return ", ".join(names) or "a model"

    def served_fingerprint(self) -> str | None:
        """The content fingerprint the server reports for the model (ours does, in
        `GET /v1/models`; a vLLM server does not: None)."""
        listed = self._request("GET", "/v1/models", None, retries=self.retries)
        for model in listed.get("data") or []:
            if isinstance(model, dict) and (self.served_name is None or model.get("id") == self.served_name):
                value = model.get("fingerprint")
                return str(value) if value else None
        return None

    def score(self, texts: Sequence[str], rows: Sequence[Any], add_special_tokens: bool = True) -> torch.Tensor:
        """Raw scores (b,) float32, `batch_size` texts per request. `add_special_tokens`
        false for texts a chat template rendered (they hold their own BOS); vLLM adds
        them unless told, like a tokenizer's plain call."""
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start:start + self.batch_size])
            body: dict[str, Any] = {"input": chunk, "use_activation": False, "add_special_tokens": add_special_tokens}
            if self.served_name is not None:
                body["model"] = self.served_name
            answer = self._request("POST", "/classify", body, retries=self.retries)
            data = sorted(answer.get("data") or [], key=lambda item: item.get("index", 0))
            if len(data) != len(chunk) or any(len(item.get("probs") or []) != 1 for item in data):
                raise RewardServerRefused(
                    f"{self.url}/classify answered {len(data)} results for {len(chunk)} texts, or not one score each; "
                    "the served model must be a one-label classifier"
                )
            scores.extend(float(item["probs"][0]) for item in data)
        return torch.tensor(scores, dtype=torch.float32)

    def _request(self, method: str, path: str, body: dict[str, Any] | None, *, retries: int) -> dict[str, Any]:
        endpoint = f"{self.url}{path}"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        payload = None if body is None else json.dumps(body).encode()
        last = ""
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(FIRST_BACKOFF_S * 2 ** (attempt - 1))
            request = urllib.request.Request(endpoint, data=payload, headers=headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
                    return json.loads(response.read().decode())
            except urllib.error.HTTPError as error:
                detail = error.read().decode(errors="replace")[:300]
                last = f"HTTP {error.code} {error.reason}: {detail}"
                if error.code not in TRANSIENT_STATUSES:
                    raise RewardServerRefused(f"reward model server {method} {endpoint} answered {last}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as error:
                reason = getattr(error, "reason", error)
                last = f"no answer ({type(reason).__name__}: {reason})"
        tries = f"{retries + 1} attempt{'s' if retries else ''}"
        raise RewardServerError(f"reward model server {method} {endpoint}: {last} after {tries}")


class ServedScorer:
    """A reward model served at `rl.reward.model.url` (S-RM-1), behind the same scoring
    protocol as a local one: the rendered texts go to the server, which tokenizes them."""

    def __init__(self, client: RewardClient, add_special_tokens: bool):
        self.client = client
        self.add_special_tokens = add_special_tokens

    def score(self, texts: Sequence[str], encoded: Sequence[list[int]] | None, rows: Sequence[Any]) -> torch.Tensor:
        return self.client.score(texts, rows, add_special_tokens=self.add_special_tokens)
