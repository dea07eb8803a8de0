"""What a published version costs on each weight transport (S-SCALE-3, S-XFER-1).

`python -m bench.weight_stream` starts a local Ray with two actors, a publisher standing
for policy rank 0 and an engine standing for a rollout engine (the HF engine's load path
around a model loaded from the same folder, its weights zeroed first). For each
transport (`object_store`, `nixl`) and bucket size it publishes the model's weights
through `weights.publication.publish`, as the policy does, and loads them into
the engine through `WeightPublication.fetch`, as the rollout role does, `--repeats`
times. It prints medians of the publication and load times, the engine process's
largest RSS rise during a load (its high-water mark reset before each; the object store's shared
pages count once touched), the buffers each side keeps between versions, the bytes of weights put
into the object store, the size of what did travel through Ray (the pickled
publication), and whether the engine ended with the publisher's weights bit for bit.

    .venv/bin/python -m bench.weight_stream                       # the 103.9M Qwen3 of bench.fsdp_memory
    .venv/bin/python -m bench.weight_stream --size 300m --repeats 3
    .venv/bin/python -m bench.weight_stream --bucket-mib 8 64 4096 --transports object_store
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench.fsdp_memory import SPEC as SPEC_100M

SIZES = {
    "100m": SPEC_100M,  # 103,869,696 parameters
    "300m": dict(SPEC_100M, hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=4),
}


def build(size: str, root: str) -> str:
    from configs.schema import ModelConfig, TinyModelSpec
    from models.model_io import ensure_model

    path = os.path.join(root, f"ppo-bench-qwen3-{size}")
    return ensure_model(ModelConfig(path=path, tiny=TinyModelSpec(**SIZES[size])))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class Publisher:
    """Policy rank 0: the model's weights gathered into buckets and published from a
    Ray actor, so the object store path really puts each bucket."""

    def __init__(self, model_dir: str) -> None:
        from models.model_io import load_causal_lm

        torch.set_num_threads(1)
        self.model = load_causal_lm(model_dir, "float32")
        self.version = 0

    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def publish(self, transport: str, bucket_bytes: int):
        from trainer.sharding import full_weight_buckets
        from weights.publication import publish

        from weights import nixl_transport

        self.version += 1
        started = time.perf_counter()
        publication = publish(
            full_weight_buckets(self.model, keep=True, bucket_bytes=bucket_bytes), transport=transport,
            version=self.version,
        )
        seconds = time.perf_counter() - started
        staged, _ = nixl_transport.held_bytes()
        return publication, seconds, staged


class Engine:
    """A rollout engine's load path in a process of its own, so its peak memory is
    its own."""

    def __init__(self, model_dir: str) -> None:
        from models.model_io import load_causal_lm
        from roles.rollout.hf_engine import HFEngine

        torch.set_num_threads(1)
        self.engine = HFEngine.__new__(HFEngine)
        self.engine.model = load_causal_lm(model_dir, "float32")
        self.want = {name: tensor.clone() for name, tensor in self.engine.model.state_dict().items()}

    def load(self, publication) -> dict:
        with torch.no_grad():
            for tensor in self.engine.model.state_dict().values():
                tensor.zero_()
        Path("/proc/self/clear_refs").write_text("5")  # the RSS high-water mark restarts from now
        before = _status_kib("VmRSS")
        started = time.perf_counter()
        received = self.engine.load_weights(
            publication.fetch("bench engine", timeout_s=600, owned=self.engine.keeps_buckets)
        )
        seconds = time.perf_counter() - started
        peak = _status_kib("VmHWM")
        state = self.engine.model.state_dict()
        from weights import nixl_transport

        _, buffer = nixl_transport.held_bytes()
        return {"seconds": seconds, "peak_rise": (peak - before) * 1024, "received": received, "buffer": buffer,
                "equal": all(torch.equal(state[name], tensor) for name, tensor in self.want.items())}


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="100m")
    parser.add_argument("--bucket-mib", type=float, nargs="+", default=[64])
    parser.add_argument("--transports", nargs="+", default=["object_store", "nixl"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model-root", default=tempfile.gettempdir())
    args = parser.parse_args()
    from processes.ray_session import init_ray, prepare_ray_auth

    prepare_ray_auth(joins_cluster=False)  # before Ray is imported
    import ray

    model_dir = build(args.size, args.model_root)
    init_ray(num_cpus=2)
    parameters = ray.get(ray.remote(Publisher).remote(model_dir).parameters.remote())
    print(f"bench.weight_stream: Qwen3 of {parameters:,} parameters (fp32, {parameters * 4 / 2**20:.0f} MiB), "
          f"{args.repeats} loads per row, load average {load_average()}")
    print(f"  {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print("| transport | bucket MiB | buckets | publish s | load s | engine peak RSS rise MiB "
          "| engine receive buffer MiB | publisher staging MiB | weight bytes into the object store "
          "| bytes through Ray (pickled publication) "
          "| weights equal | load avg |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for transport in args.transports:
        for mib in args.bucket_mib:
            # Fresh processes for each row: what a row's buffers cost is its own.
            publisher, engine = ray.remote(Publisher).remote(model_dir), ray.remote(Engine).remote(model_dir)
            publishes, loads = [], []
            for _ in range(args.repeats):
                publication, seconds, staged = ray.get(publisher.publish.remote(transport, int(mib * 2**20)))
                publishes.append(seconds)
                loads.append(ray.get(engine.load.remote(publication)))
                shipped, buckets = len(pickle.dumps(publication)), publication.buckets
                into_store = 0 if publication.transport == "nixl" else publication.bytes  # each bucket a ray.put
                del publication
            print(f"| {transport} | {mib:g} | {buckets} | {statistics.median(publishes):.2f} "
                  f"| {statistics.median(r['seconds'] for r in loads):.2f} "
                  f"| {max(r['peak_rise'] for r in loads) / 2**20:.0f} "
                  f"| {loads[-1]['buffer'] / 2**20:.0f} "
                  f"| {staged / 2**20:.0f} | {into_store:,} | {shipped:,} "
                  f"| {all(r['equal'] for r in loads)} | {load_average()} |", flush=True)
            ray.kill(publisher)
            ray.kill(engine)
    ray.shutdown()


if __name__ == "__main__":
    main()
