"""S-RM-1: a served reward model. Our server (models/reward_server.py) started for real
on loopback, answered through the client with vLLM's `/classify` request; the
scores equal the in-process reward model's; a token is required beyond loopback;
failures name the endpoint and the status; the pre-flight checks the URL answers."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from configs.loading import load_config
from configs.schema import RewardModelConfig
from models.reward_client import RewardClient, RewardServerError, RewardServerRefused
from models.reward_client import ServedScorer
from models.reward_model import LocalScorer, RewardText, RowOrigin
from models.reward_server import TOKEN_ENV, UnsafeListen, serve
from tests.conftest import REPO_ROOT, TINY_PROFILE

TEXTS = ["<|im_start|>user\n3<|im_end|>\n<|im_start|>assistant\n3<|im_end|>\n",
         "<|im_start|>user\n3<|im_end|>\n<|im_start|>assistant\n57<|im_end|>\n"]
ROWS = [RowOrigin(0, None), RowOrigin(1, None)]


@pytest.fixture(scope="module")
def served(tiny_reward_model_dir):
    """One real server with a token, on a free loopback port, for the module."""
    server = serve(tiny_reward_model_dir, "127.0.0.1", 0, "tiny-reward", token="s3cret")
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _client(url: str, token: str | None = "s3cret", retries: int = 0, batch_size: int = 1) -> RewardClient:
    return RewardClient(url, "tiny-reward", token, timeout_seconds=10.0, retries=retries, batch_size=batch_size)


def test_served_scores_equal_the_local_models_in_batches(served, tiny_reward_model_dir):
    local = LocalScorer(RewardText(tiny_reward_model_dir, 64), "float32", 8)
    expected = local.score_ids(local.text.token_ids(TEXTS, ROWS)).tolist()
    assert _client(served, batch_size=1).score(TEXTS, ROWS).tolist() == pytest.approx(expected, abs=1e-6)
    assert _client(served, batch_size=2).score(TEXTS, ROWS).tolist() == pytest.approx(expected, abs=1e-6)
    assert _client(served).check() == "tiny-reward"


def test_without_the_token_the_server_refuses_and_the_error_names_endpoint_and_status(served):
    with pytest.raises(RewardServerRefused) as caught:
        _client(served, token=None).score(TEXTS, ROWS)
    assert str(caught.value).startswith(f"reward model server POST {served}/classify answered HTTP 401")


def test_an_unreachable_endpoint_is_retried_then_named():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RewardServerError, match=rf"POST {url}/classify: no answer .* after 2 attempts"):
        _client(url, retries=1).score(TEXTS, ROWS)


def test_listening_beyond_loopback_needs_a_token(tiny_reward_model_dir):
    with pytest.raises(UnsafeListen, match=TOKEN_ENV):
        serve(tiny_reward_model_dir, "0.0.0.0", 0, "tiny-reward", token=None)


@pytest.mark.slow  # a Python process importing torch: seconds the default suite does not have
def test_the_command_refuses_to_listen_beyond_loopback_without_a_token(tiny_reward_model_dir):
    started = subprocess.run(
        [sys.executable, "-m", "models.reward_server", tiny_reward_model_dir, "--host", "0.0.0.0", "--port", "0"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"},
    )
    assert started.returncode == 2 and started.stderr.startswith("error: --host 0.0.0.0 listens beyond loopback")


def test_the_preflight_checks_that_the_url_answers(served, tiny_reward_model_dir, monkeypatch):
    from rundir.preflight_checks import check_manifest

    monkeypatch.setenv("PPO_TEST_REWARD_TOKEN", "s3cret")
    base = load_config(TINY_PROFILE, ["rl.reward.terminal=none"])

    def with_url(url: str):
        reward = base.rl.reward.model_copy(update={"model": RewardModelConfig(
            url=url, path=tiny_reward_model_dir, served_name="tiny-reward", token_env="PPO_TEST_REWARD_TOKEN",
            retries=0, max_length=64,
        )})
        return base.model_copy(update={"rl": base.rl.model_copy(update={"reward": reward})})

    report = check_manifest(with_url(served))
    assert any(line == f"reward model served at {served}: tiny-reward" for line in report.summary), report.summary
    assert "rl.reward.model.url" not in report.keys()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    report = check_manifest(with_url(dead))
    assert [p.key for p in report.problems if p.key == "rl.reward.model.url"] == ["rl.reward.model.url"]
    assert f"GET {dead}/v1/models: no answer" in str(report.problems[-1])


def test_the_reward_role_scores_through_the_server(served, tiny_reward_model_dir, monkeypatch):
    from roles.reward_role import RewardRole
    from tests.in_process.test_reward_model_role import _generated

    monkeypatch.setenv("PPO_TEST_REWARD_TOKEN", "s3cret")
    base = load_config(TINY_PROFILE, ["rl.reward.terminal=none", f"rl.reward.model.path={tiny_reward_model_dir}"])
    local = RewardRole(base)
    settings = base.rl.reward.model.model_copy(update={
        "url": served, "served_name": "tiny-reward", "token_env": "PPO_TEST_REWARD_TOKEN"})
    remote_config = base.model_copy(update={"rl": base.rl.model_copy(update={
        "reward": base.rl.reward.model_copy(update={"model": settings})})})
    remote = RewardRole(remote_config)
    assert isinstance(remote.model_term.scorer, ServedScorer)  # served: only the tokenizer is loaded here
    assert isinstance(remote.model_term.text, RewardText)
    trajectory = _generated(["3", "4"], ["3", "57"], ["3", "4"])
    assert remote.score(trajectory)[0].sequence_scores.tolist() == pytest.approx(
        local.score(trajectory)[0].sequence_scores.tolist(), abs=1e-6)


def test_a_tokenizer_that_adds_bos_scores_the_same_served_and_local(tiny_reward_model_dir, tmp_path, monkeypatch):
    """A chat template writes its own BOS; a server asked with vLLM's default
    (`add_special_tokens` true) would add a second one. The role says false for
    templated texts, so a BOS-adding tokenizer's scores match the local model's."""
    import shutil

    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from roles.reward_role import RewardRole
    from tests.in_process.test_reward_model_role import _generated

    folder = tmp_path / "bos-reward"
    shutil.copytree(tiny_reward_model_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{tokenizer.bos_token} $A", special_tokens=[(tokenizer.bos_token, tokenizer.bos_token_id)])
    tokenizer.save_pretrained(folder)
    assert AutoTokenizer.from_pretrained(folder)("3")["input_ids"][0] == tokenizer.bos_token_id
    server = serve(str(folder), "127.0.0.1", 0, "bos-reward", token=None)
    try:
        monkeypatch.delenv("PPO_TEST_REWARD_TOKEN", raising=False)
        base = load_config(TINY_PROFILE, ["rl.reward.terminal=none", f"rl.reward.model.path={folder}"])
        settings = base.rl.reward.model.model_copy(update={
            "url": f"http://127.0.0.1:{server.server_address[1]}", "served_name": "bos-reward"})
        remote = RewardRole(base.model_copy(update={"rl": base.rl.model_copy(update={
            "reward": base.rl.reward.model_copy(update={"model": settings})})}))
        trajectory = _generated(["3", "4"], ["3", "57"], ["3", "4"])
        assert remote.score(trajectory)[0].sequence_scores.tolist() == pytest.approx(
            RewardRole(base).score(trajectory)[0].sequence_scores.tolist(), abs=1e-6)
    finally:
        server.shutdown()
        server.server_close()


def _served_config(url: str):
    settings = RewardModelConfig(url=url, served_name="tiny-reward", token_env="PPO_TEST_REWARD_TOKEN")
    base = load_config(TINY_PROFILE, ["rl.reward.terminal=none"])
    return base.model_copy(update={"rl": base.rl.model_copy(update={
        "reward": base.rl.reward.model_copy(update={"model": settings})})})


def test_a_resume_over_another_served_model_is_refused_by_its_url(served, tiny_reward_model_dir, monkeypatch):
    from models.fingerprint import fingerprint_folder
    from rundir.run_identity import SERVED_KEY, RunIdentity, identity_problem

    monkeypatch.setenv("PPO_TEST_REWARD_TOKEN", "s3cret")
    config = _served_config(served)
    identity = RunIdentity.at_launch(config)
    assert identity.served == fingerprint_folder(tiny_reward_model_dir).digest
    same = {"loop_state": {SERVED_KEY: identity.served}}
    assert identity_problem(same, identity, "iter_000002") is None
    other = {"loop_state": {SERVED_KEY: "sha256:" + "0" * 64}}
    assert identity_problem(other, identity, "iter_000002").startswith(
        f"rl.reward.model.url: {served} now serves a reward model with fingerprint sha256:")


def test_a_commit_records_the_served_model_read_at_launch_with_the_server_down(
    tiny_reward_model_dir, monkeypatch, tmp_path
):
    """S-RM-2: the launch reads the served fingerprint once; a server that is down
    between two commits cannot fail the second one (no commit talks to it)."""
    from rundir.run_identity import SERVED_KEY, RunIdentity, identity_problem, record_identity

    monkeypatch.setenv("PPO_TEST_REWARD_TOKEN", "s3cret")
    server = serve(tiny_reward_model_dir, "127.0.0.1", 0, "tiny-reward", token="s3cret")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        identity = RunIdentity.at_launch(_served_config(url))
        first = record_identity(identity, str(tmp_path / "iter_000001"))
    finally:
        server.shutdown()
        server.server_close()
    second = record_identity(identity, str(tmp_path / "iter_000002"))  # the server is gone now
    assert second[SERVED_KEY] == first[SERVED_KEY] == identity.served is not None
    assert identity_problem({"loop_state": second}, identity, "iter_000002") is None


def test_a_transient_status_is_retried_and_a_refusal_is_not(served):
    """A small forwarding server in front of ours: it answers 503 to the first request,
    then passes requests on; a client with one retry gets the scores, one without fails
    naming the endpoint and the status."""
    import threading
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answered = []

    class Flaky(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            answered.append(self.path)
            if len(answered) % 2:  # every other request: the server is overloaded
                self.send_response(503)
                self.send_header("Content-Length", "4")
                self.end_headers()
                self.wfile.write(b"busy")
                return
            forwarded = urllib.request.Request(f"{served}{self.path}", data=body, method="POST",
                                               headers={k: v for k, v in self.headers.items()})
            with urllib.request.urlopen(forwarded, timeout=10) as response:
                payload = response.read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    flaky = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=flaky.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{flaky.server_address[1]}"
    try:
        scores = _client(url, retries=1, batch_size=2).score(TEXTS, ROWS)
        assert len(scores) == 2 and answered == ["/classify", "/classify"]  # 503, then the answer
        with pytest.raises(RewardServerError, match=rf"POST {url}/classify: HTTP 503 .*busy after 1 attempt$"):
            _client(url, retries=0).score(TEXTS, ROWS)
    finally:
        flaky.shutdown()
        flaky.server_close()
