"""Bytes a rollout engine holds at once while loading a published version (S-SCALE-3).

`python -m bench.weight_stream [--bucket-mib 8 64 4096]` starts a local Ray, publishes
the weights of a Qwen3 model of about 128 MiB (fp32, tied embeddings published under
both names) from a Ray actor through `trainer.weight_publication.publish`, exactly as
the policy does, and loads them into a transformers engine in this process, bucket by
bucket. It prints, per bucket size: the buckets, the largest, and the most bucket bytes
the engine held at any moment (counted from when a bucket is fetched until its tensors
are freed). A bound that holds: one bucket, never the whole version. Figures in
docs/launch.md ("Weights (S-SCALE-3)").
"""

from __future__ import annotations

import argparse
import time
import weakref

import torch

SPEC = dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
            num_key_value_heads=4, head_dim=64, tie_word_embeddings=True)


def qwen3(seed: int) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(**SPEC)).eval()


class Publisher:
    """Stands for policy rank 0: publishes from inside a Ray actor, so each bucket is
    put into the object store as it is gathered."""

    def __init__(self) -> None:
        self.model = qwen3(0)

    def publish(self, bucket_bytes: int):
        from trainer.sharding import full_weight_buckets
        from trainer.weight_publication import publish

        return publish(full_weight_buckets(self.model, keep=True, bucket_bytes=bucket_bytes))


def held_while_loading(engine, published) -> tuple[int, float]:
    """(most bucket bytes alive at once, seconds) for one load through the engine."""
    live, peak = [0], [0]

    def counted(buckets):
        for bucket in buckets:
            size = sum(t.numel() * t.element_size() for t in bucket.values())
            live[0] += size
            peak[0] = max(peak[0], live[0])
            weakref.finalize(next(iter(bucket.values())), lambda size=size: live.__setitem__(0, live[0] - size))
            yield bucket
            del bucket

    started = time.perf_counter()
    engine.load_weights(counted(published.fetch()))
    return peak[0], time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket-mib", type=float, nargs="+", default=[8, 64, 4096])
    args = parser.parse_args()
    from processes.ray_session import init_ray, prepare_ray_auth

    prepare_ray_auth(joins_cluster=False)  # before Ray is imported
    import ray

    from roles.rollout.hf_engine import HFEngine

    init_ray(num_cpus=2)
    publisher = ray.remote(Publisher).remote()
    engine = HFEngine.__new__(HFEngine)  # the engine's load path, around a model built here
    engine.model = qwen3(1)
    want = qwen3(0).state_dict()
    total = sum(t.numel() * t.element_size() for t in want.values())
    for mib in args.bucket_mib:
        published = ray.get(publisher.publish.remote(int(mib * 2**20)))
        peak, seconds = held_while_loading(engine, published)
        equal = all(torch.equal(engine.model.state_dict()[name], tensor) for name, tensor in want.items())
        print(f"buckets of {mib:g} MiB: {published.buckets} buckets, largest {max(published.sizes) / 2**20:.1f} MiB; "
              f"version {total / 2**20:.1f} MiB; the engine held at most {peak / 2**20:.1f} MiB at once; "
              f"load {seconds:.2f} s; weights equal: {equal}")
        engine.model.load_state_dict(qwen3(1).state_dict())
    ray.shutdown()


if __name__ == "__main__":
    main()
