"""What the base-model fingerprint (S-SEC-4) costs at start-up: a model folder of the
0.6B profile's size (1.2 GB of safetensors in two shards, plus config and tokenizer
files) digested cold (page cache dropped, when this process may drop it), warm (files
in the page cache), and through the size-and-mtime cache every later start uses.

    python -m bench.fingerprint [--gigabytes 1.2] [--repeats 3]

Figures with the load average go to docs/performance.md ("The base-model fingerprint").
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from models.fingerprint import FingerprintCache, fingerprint_folder


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def _write_model(folder: Path, gigabytes: float) -> int:
    shard_bytes = int(gigabytes * 1e9 / 2)
    generator = torch.Generator().manual_seed(0)
    for index in range(2):
        count = shard_bytes // 2  # bfloat16
        weights = {f"layer{index}.weight": torch.randn(count, generator=generator).to(torch.bfloat16)}
        save_file(weights, folder / f"model-0000{index + 1}-of-00002.safetensors", metadata={"format": "pt"})
    for name, text in (("config.json", "{}"), ("tokenizer.json", "{}"), ("tokenizer_config.json", "{}")):
        (folder / name).write_text(text)
    return sum(path.stat().st_size for path in folder.iterdir())


def _drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gigabytes", type=float, default=1.2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ppo-fingerprint-") as scratch:
        folder = Path(scratch) / "model"
        folder.mkdir()
        size = _write_model(folder, args.gigabytes)
        print(f"model folder: {size / 1e9:.2f} GB in {len(list(folder.iterdir()))} files; load {_load()}")
        rows: dict[str, list[float]] = {"cold": [], "warm": [], "cached": []}
        cache_file = Path(scratch) / "cache.json"
        for _ in range(args.repeats):
            if _drop_page_cache():
                started = time.perf_counter()
                fingerprint_folder(folder, cache=FingerprintCache(None))
                rows["cold"].append(time.perf_counter() - started)
            started = time.perf_counter()
            fingerprint_folder(folder, cache=FingerprintCache(None))
            rows["warm"].append(time.perf_counter() - started)
            cache_file.unlink(missing_ok=True)
            fingerprint_folder(folder, cache=FingerprintCache(cache_file))  # fills the cache
            started = time.perf_counter()
            fingerprint_folder(folder, cache=FingerprintCache(cache_file))
            rows["cached"].append(time.perf_counter() - started)
        for name, seconds in rows.items():
            if not seconds:
                print(f"{name:>6}: not measured (cannot drop the page cache here)")
                continue
            rate = "" if name == "cached" else f", {size / 1e9 / statistics.median(seconds):.2f} GB/s"
            print(f"{name:>6}: median {statistics.median(seconds):.3f} s over {len(seconds)} "
                  f"({', '.join(f'{s:.3f}' for s in seconds)}){rate}; load {_load()}")


if __name__ == "__main__":
    main()
