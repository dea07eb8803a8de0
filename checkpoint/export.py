"""Export a committed boundary as plain Hugging Face model folders.

`python -m checkpoint.export BOUNDARY OUT` writes OUT/policy (loads with
AutoModelForCausalLM.from_pretrained, tokenizer and chat template included) and
OUT/critic (AutoModelForTokenClassification, the value head as its `score` layer).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from checkpoint.boundary import CheckpointError, read_marker


def export_boundary(boundary: str, out: str) -> dict[str, str]:
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    if read_marker(boundary) is None:
        raise CheckpointError(f"{boundary} is not a committed boundary (no _SUCCESS); refusing to export it")
    written = {}
    for role, auto_class in (("policy", AutoModelForCausalLM), ("critic", AutoModelForTokenClassification)):
        source = f"{boundary}/{role}"
        target = str(Path(out) / role)
        model = auto_class.from_pretrained(source)
        model.save_pretrained(target)
        if (Path(source) / "tokenizer_config.json").exists():
            AutoTokenizer.from_pretrained(source).save_pretrained(target)
        written[role] = target
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checkpoint.export", description=__doc__.strip().splitlines()[0])
    parser.add_argument("boundary", help="a committed boundary, e.g. outputs/tiny-cpu/checkpoints/iter_000040")
    parser.add_argument("out", help="folder to write policy/ and critic/ into")
    args = parser.parse_args(argv)
    try:
        written = export_boundary(args.boundary.rstrip("/"), args.out)
    except (CheckpointError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for role, path in written.items():
        print(f"{role}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
