"""S-XFER-1: weights over NIXL (UCX, host memory) between a publishing agent and an
engine's agent, as in an in-process run: bit-exact, and refused by name when a bucket
arrives corrupted, from another version, or not at all within the stage's time."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from configs.loading import load_config
from flows.in_process import run_in_process
from rundir.run_outputs import RunPaths
from tests.conftest import REPO_ROOT, TINY_PROFILE
from tests.support.helpers import without_timings
from weights import nixl_package, nixl_transport
from weights.nixl_transport import WeightTransferError
from weights.publication import publish

UNAVAILABLE = nixl_package.unavailable_reason()  # either CUDA build of NIXL, as the transport loads it
if UNAVAILABLE:
    pytest.skip(UNAVAILABLE, allow_module_level=True)


def buckets(version: int) -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(version)
    return [
        {"a.weight": torch.randn(3, 5), "a.bias": torch.arange(7, dtype=torch.int64)},
        {"b.weight": torch.randn(4, 4).to(torch.bfloat16), "c": torch.ones(1, dtype=torch.float16)},
    ]


def fetched(publication, **kwargs) -> list[dict[str, torch.Tensor]]:
    return [dict(bucket) for bucket in publication.fetch("rollout engine 0", **kwargs)]


def test_buckets_arrive_bit_exact_and_a_corrupted_or_replaced_one_is_refused_by_name():
    first = publish(buckets(1), transport="nixl", version=1)
    assert first.transport == "nixl" and first.buckets == 2
    assert all(len(bucket.descriptor) < 4096 for bucket in first.stored)  # only descriptors travel
    for got, sent in zip(fetched(first), buckets(1)):
        assert got.keys() == sent.keys()
        assert all(got[k].dtype == sent[k].dtype and torch.equal(got[k], sent[k]) for k in sent)

    # A byte flipped in the publisher's memory after the checksum: refused, naming the bucket.
    region = nixl_transport.publisher(True).regions[1]
    region[nixl_transport.HEADER_BYTES] ^= 1
    with pytest.raises(WeightTransferError, match=r"rollout engine 0, bucket 1 of 2 arrived corrupted"):
        fetched(first)

    # The policy staged the next version before this engine read the first: refused by version.
    publish(buckets(2), transport="nixl", version=2)
    with pytest.raises(WeightTransferError, match=r"bucket 0 of 2 holds policy_version 2, not 1"):
        fetched(first)


FROZEN_PEER = r"""
import multiprocessing, os, signal, sys, time
import torch
from weights.publication import publish

def policy(pipe):
    pipe.send(publish([{"w": torch.randn(256, 256)}], transport="nixl", version=1))
    time.sleep(60)

if __name__ == "__main__":
    ours, theirs = multiprocessing.get_context("fork").Pipe()
    child = multiprocessing.get_context("fork").Process(target=policy, args=(theirs,), daemon=True)
    child.start()
    publication = ours.recv()
    os.kill(child.pid, signal.SIGSTOP)  # the policy's process is frozen, its memory registered
    started = time.monotonic()
    try:
        list(publication.fetch("rollout engine 0", timeout_s=1.0))
        print("READ-FINISHED")
    except Exception as error:
        print(f"REFUSED after {time.monotonic() - started:.1f}s: {error}")
    os.kill(child.pid, signal.SIGKILL)
"""


def test_a_frozen_policy_process_fails_the_read_by_its_deadline(tmp_path):
    """Over UCX's TCP transport a READ needs the peer's progress, so a stopped policy
    process stalls it; the engine gives up at its deadline with a named error. (Over
    shared memory the READ needs no peer and finishes.)"""
    script = tmp_path / "frozen_peer.py"
    script.write_text(FROZEN_PEER)
    env = {**os.environ, "UCX_TLS": "tcp", "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, str(script)], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    line = [line for line in result.stdout.splitlines() if line.startswith(("REFUSED", "READ-FINISHED"))]
    assert line, result.stdout[-2000:] + result.stderr[-2000:]
    assert re.match(r"REFUSED after [12]\.\d+s: weight sync over nixl: rollout engine 0, bucket 0 of 1 from policy-"
                    r".* did not arrive within the stage's time \(rl.stage_timeout_seconds\)", line[0]), line[0]


def test_an_in_process_run_over_nixl_equals_the_object_store_run(tiny_overrides):
    """Both runs in one process, two agents: the weights and train/* are bitwise equal,
    and the rows say NIXL moved the weights."""
    runs = {}
    for transport in ("object_store", "nixl"):
        overrides = ["rl.max_steps=2", "rl.save_every=0", f"rl.weight_sync_transport={transport}",
                     f"job.name={transport}", "rl.rollout.weight_sync_bucket_mib=0.05"]
        config = load_config(TINY_PROFILE, tiny_overrides + overrides)
        runs[transport] = run_in_process(config, paths=RunPaths.for_config(config))
    (store_rows, store_roles), (nixl_rows, nixl_roles) = runs["object_store"], runs["nixl"]
    assert all(r["perf/weight_sync_nixl_bytes"] >= r["perf/weight_sync_bytes"] > 0 for r in nixl_rows)
    assert all("perf/weight_sync_nixl_bytes" not in r for r in store_rows)
    strip = [{k: v for k, v in without_timings(r).items() if k != "perf/weight_sync_nixl_bytes"} for r in nixl_rows]
    assert strip == [without_timings(r) for r in store_rows]
    for role in ("policy", "critic"):
        ours, theirs = getattr(nixl_roles, role).model.state_dict(), getattr(store_roles, role).model.state_dict()
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs), role
    engine = nixl_roles.rollout.engine.model.state_dict()
    policy = nixl_roles.policy.model.state_dict()
    assert all(torch.equal(engine[k], policy[k]) for k in engine)  # the engine serves what the policy published
