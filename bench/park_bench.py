"""What the colocated policy's park costs at the public profile's size (S-RUN-4).

A Qwen3-0.6B-shaped model (random weights, built from its published dimensions, so
nothing is downloaded) is put in the trainer's `UpdateRuntime` on the GPU and given
one AdamW step, so its optimizer state exists. Then its whole state (weights and
both AdamW moments) is parked on the host and brought back, several times, two ways:

* pinned: the default, reused page-locked buffers and queued copies (trainer/pinned_park.py);
* pageable: plain `Module.to`, fresh pageable host memory every park.

It prints, for each way, the first park (the pinned way allocates its buffers then),
the median of the later parks and unparks, the bandwidth, and how much GPU memory a
park really frees. Needs a CUDA GPU:

    python -m bench.park_bench                      # bf16, as the public profile trains
    python -m bench.park_bench --dtype float32 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

QWEN3_06B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, tie_word_embeddings=True,
)


def build_runtime(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, Qwen3Config

    from configs.schema import OptimizerConfig
    from trainer.update_runtime import UpdateRuntime

    started = time.perf_counter()
    with torch.device("cuda"):  # initialise on the GPU: far faster than 0.6B random draws on the host
        model = AutoModelForCausalLM.from_config(Qwen3Config(**QWEN3_06B), dtype=dtype)
    runtime = UpdateRuntime("policy", model, OptimizerConfig(), lr=1e-6, device="cuda")
    ids = torch.randint(0, QWEN3_06B["vocab_size"], (2, 64), device="cuda")
    runtime.model(input_ids=ids).logits.float().mean().backward()
    runtime.optimizer.step()
    runtime.optimizer.zero_grad(set_to_none=True)  # as park() does
    torch.cuda.synchronize()
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters, {dtype}, built and stepped "
          f"in {time.perf_counter() - started:.1f} s")
    return runtime


def cycle(runtime, repeats: int) -> dict[str, float]:
    parks, unparks = [], []
    moved = 0
    freed = 0
    for _ in range(repeats):
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()
        started = time.perf_counter()
        moved = runtime.place("cpu")
        torch.cuda.synchronize()
        parks.append(time.perf_counter() - started)
        torch.cuda.empty_cache()
        freed = resident - torch.cuda.memory_allocated()
        started = time.perf_counter()
        runtime.place("cuda")
        torch.cuda.synchronize()
        unparks.append(time.perf_counter() - started)
    later_parks = parks[1:] or parks
    return {
        "bytes": float(moved),
        "freed": float(freed),
        "first_park": parks[0],
        "park": statistics.median(later_parks),
        "unpark": statistics.median(unparks),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("park_bench: no CUDA GPU visible to torch; the park only exists on a GPU", file=sys.stderr)
        return 2
    print(f"park_bench: {torch.cuda.get_device_name()} torch {torch.__version__}")
    runtime = build_runtime(getattr(torch, args.dtype))
    results = {}
    for way, pinned in (("pinned", True), ("pageable", False)):
        runtime.pin_host_copies = pinned
        results[way] = cycle(runtime, args.repeats)
    print(f"\n{'way':<10}{'GB moved':>10}{'GB freed':>10}{'first park s':>14}{'park s':>9}{'unpark s':>10}"
          f"{'park GB/s':>11}{'unpark GB/s':>13}")
    for way, r in results.items():
        gb = r["bytes"] / 1e9
        print(f"{way:<10}{gb:>10.2f}{r['freed'] / 1e9:>10.2f}{r['first_park']:>14.3f}"
              f"{r['park']:>9.3f}{r['unpark']:>10.3f}{gb / r['park']:>11.1f}{gb / r['unpark']:>13.1f}")
    ratio = (results["pageable"]["park"] + results["pageable"]["unpark"]) / (
        results["pinned"]["park"] + results["pinned"]["unpark"]
    )
    print(f"\npark + unpark, pageable / pinned: {ratio:.2f}x "
          f"(medians of {max(1, args.repeats - 1)} parks, {args.repeats} unparks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
