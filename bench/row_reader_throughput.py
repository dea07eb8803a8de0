"""Throughput and memory of the row reader on a large JSONL file (S-DATA-3).

Why: the reader must stream, so its peak memory has to stay flat however big
the file is, and it must not become the bottleneck of the data role. This
script writes a file of prompt-shaped rows (plain-string prompts, chat
conversations and multimodal parts mixed, as a real file would be), reads it
back with ``iter_rows`` and prints rows/s, MB/s and the peak resident memory.

    .venv/bin/python -m bench.row_reader_throughput            # ~1 GB
    .venv/bin/python -m bench.row_reader_throughput --gb 0.05  # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

from data.row_reader import DEFAULT_CHUNK_SIZE, iter_rows

_BATCH_ROWS = 10_000  # rows written per write() call: keeps generation memory small


def _sample_rows(i: int) -> list[dict]:
    """A few row shapes, varied by ``i`` so the decoder cannot cache anything."""
    return [
        {"prompt": f"What is {i} + {i * 7 % 1000}?", "answer": str(i + i * 7 % 1000)},
        {
            "prompt": [
                {"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": f"Solve step by step: {i} * 3 - 11 = ?"},
            ],
            "answer": 3 * i - 11,
            "id": f"row-{i}",
        },
        {
            "prompt": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": f"images/{i:08d}.png"},
                        {"type": "text", "text": "Describe the picture in one sentence."},
                    ],
                }
            ],
            "meta": {"source": "bench", "split": "train", "n": i},
        },
    ]


def write_jsonl(path: Path, target_bytes: int) -> tuple[int, int]:
    """Write rows until ``target_bytes``; return (rows, bytes) written."""
    rows = 0
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target_bytes:
            lines = []
            for _ in range(_BATCH_ROWS // 3):
                for row in _sample_rows(rows):
                    lines.append(json.dumps(row))
                    rows += 1
            text = "\n".join(lines) + "\n"
            out.write(text)
            written += len(text.encode("utf-8"))
    return rows, written


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (VmHWM), in MiB."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="file size to generate, in GB (1e9 bytes)")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="reader chunk size in bytes")
    parser.add_argument("--dir", default=None, help="where to write the file (default: a temp dir)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "rows.jsonl"
        t0 = time.perf_counter()
        n_rows, _ = write_jsonl(path, int(args.gb * 1e9))
        t_write = time.perf_counter() - t0
        size = os.path.getsize(path)
        rss_before = peak_rss_mib()
        print(f"generated {n_rows:,} rows, {size / 1e9:.3f} GB in {t_write:.1f} s "
              f"(peak RSS so far {rss_before:.1f} MiB)")

        t0 = time.perf_counter()
        count = 0
        for _ in iter_rows(str(path), chunk_size=args.chunk_size):
            count += 1
        elapsed = time.perf_counter() - t0
        if count != n_rows:
            raise SystemExit(f"read {count} rows, expected {n_rows}")
        print(f"read {count:,} rows in {elapsed:.1f} s: {count / elapsed:,.0f} rows/s, "
              f"{size / 1e6 / elapsed:,.1f} MB/s")
        print(f"peak RSS (VmHWM) {peak_rss_mib():.1f} MiB; chunk size {args.chunk_size:,} bytes; "
              f"mean row {size / count:.0f} bytes")


if __name__ == "__main__":
    main()
