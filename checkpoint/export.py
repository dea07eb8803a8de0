"""Export a committed boundary as plain Hugging Face model folders.

`python -m checkpoint.export BOUNDARY OUT` writes OUT/policy (loads with
AutoModelForCausalLM.from_pretrained, tokenizer and chat template included) and
OUT/critic (AutoModelForTokenClassification, the value head as its `score` layer).
A LoRA run's roles are written merged, with the adapter in PEFT's format under
`adapter/` of each (docs/lora.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from checkpoint.boundary import CheckpointError, read_marker
from checkpoint.dcp_io import load_tensors
from files.durable import sync_folder, sync_tree
from checkpoint.role_layout import BASE_MODEL_FILE, BASE_MODEL_KEY
from models.lora_targets import ADAPTER_CONFIG_FILE
from checkpoint.role_state import MODEL_FILE, load_model_tensors, trained_names
from checkpoint.sharded_role import SHARDED_MODEL_DIR, is_sharded_layout
from models.fingerprint import ModelFingerprint, fingerprint_folder

ADAPTER_DIR = "adapter"  # the exported adapter, in PEFT's own format, inside each role's folder


WRITING_SUFFIX = ".writing"  # the export being written, beside where it goes


def export_boundary(boundary: str, out: str) -> dict[str, str]:
    """Both roles of `boundary` under `out`, written aside and renamed into place when
    whole (S-STOP-4): a stop or a crash mid-export leaves no half-written `out`, and a
    rerun writes it again from the start."""
    if read_marker(boundary) is None:
        raise CheckpointError(f"{boundary} is not a committed boundary (no _SUCCESS); refusing to export it")
    return write_aside(out, lambda aside: _export_roles(boundary, aside))


def write_aside(out: str, write: Callable[[str], dict[str, str]]) -> dict[str, str]:
    """`write(aside)` into a fresh folder beside `out`, then that folder renamed to `out`
    (replacing an older one); the paths it returns are given under `out`."""
    final, aside = Path(out), Path(f"{out}{WRITING_SUFFIX}")
    shutil.rmtree(aside, ignore_errors=True)  # an earlier export that never finished
    aside.parent.mkdir(parents=True, exist_ok=True)
    written = write(str(aside))
    sync_tree(str(aside))  # S-CKPT-9: whole on disk before its name says it is done
    if final.exists():  # an earlier run's export of a boundary this run went past
        replaced = Path(f"{out}.replaced")
        shutil.rmtree(replaced, ignore_errors=True)
        final.rename(replaced)
        aside.rename(final)
        sync_folder(str(final.parent))
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        aside.rename(final)
        sync_folder(str(final.parent))
    return {role: str(final / Path(path).relative_to(aside)) for role, path in written.items()}


def _export_roles(boundary: str, out: str) -> dict[str, str]:
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    written = {}
    for role, auto_class in (("policy", AutoModelForCausalLM), ("critic", AutoModelForTokenClassification)):
        source = f"{boundary}/{role}"
        target = str(Path(out) / role)
        if role == "critic" and not Path(source).is_dir():
            continue  # a critic-free estimator's run commits no critic (S-OPT-2)
        if _is_vision_language(source):
            written[role] = _export_vision_language(role, source, target)
            continue
        if (Path(source) / ADAPTER_CONFIG_FILE).exists():
            written[role] = _export_lora(auto_class, source, target)
            continue
        model = _from_shards(auto_class, source) if is_sharded_layout(source) else auto_class.from_pretrained(source)
        model.save_pretrained(target)  # consolidated safetensors, whatever layout the boundary holds
        if (Path(source) / "tokenizer_config.json").exists():
            AutoTokenizer.from_pretrained(source).save_pretrained(target)
        written[role] = target
    return written


def _export_lora(auto_class: Any, source: str, target: str) -> str:
    """A LoRA role's boundary holds only what trained (the adapters, the critic's value
    head, S-LORA-2): the base model is loaded from the path PEFT recorded in
    `adapter_config.json`, the saved weights are put over it, and the result is written
    twice (S-LORA-3): merged, as a plain model `from_pretrained` loads, and under
    `adapter/` in PEFT's own format (`PeftModel.from_pretrained(base, .../adapter)`)."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoConfig

    lora = LoraConfig.from_pretrained(source)
    base_model = _base_model_for(source, lora.base_model_name_or_path)
    try:
        base = auto_class.from_pretrained(lora.base_model_name_or_path, config=AutoConfig.from_pretrained(source))
    except OSError as error:
        raise CheckpointError(
            f"{source}: its adapters were trained on {lora.base_model_name_or_path!r}, which does not load here "
            f"({error}); the export needs that base model"
        ) from None
    model = get_peft_model(base, lora)
    trained = trained_names(model) or set()
    if is_sharded_layout(source):
        weights = {name: tensor for name, tensor in model.state_dict().items() if name in trained}
        load_tensors(weights, f"{source}/{SHARDED_MODEL_DIR}", alone=True)
    else:
        weights = load_file(f"{source}/{MODEL_FILE}")
    load_model_tensors(source, model, weights)
    model.save_pretrained(str(Path(target) / ADAPTER_DIR))
    if base_model is not None:  # what a merge of this adapter must be put over
        (Path(target) / ADAPTER_DIR / BASE_MODEL_FILE).write_text(json.dumps(base_model.to_json(), indent=1) + "\n")
    model.merge_and_unload().save_pretrained(target)
    if (Path(source) / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def _base_model_for(source: str, base_path: str) -> ModelFingerprint | None:
    """The base model's fingerprint, refused when it is not the one the boundary was
    trained from (S-SEC-4): merging adapters onto another base gives another model
    under the run's name. None when the boundary records none (an older one)."""
    boundary = str(Path(source).parent)
    recorded = ((read_marker(boundary) or {}).get("loop_state") or {}).get(BASE_MODEL_KEY)
    if recorded is None or not Path(base_path).is_dir():
        return None
    current = fingerprint_folder(base_path)
    if current.digest != recorded:
        differs = current.first_difference_from(f"{boundary}/{BASE_MODEL_FILE}", recorded)
        raise CheckpointError(
            f"{source}: its adapters were trained on the base model at {base_path!r} with fingerprint "
            f"sha256:{recorded.removeprefix('sha256:')[:16]}…, but that folder now holds sha256:{current.short}…"
            f"{f' (first differing file: {differs})' if differs else ''}; merging them onto it would export another "
            "model. Put the original base model back at that path to export this boundary."
        )
    return current


def _from_shards(auto_class: Any, source: str) -> Any:
    """A role saved by FSDP2 ranks (DCP shards, checkpoint/sharded_role.py), loaded
    whole in this one process: DCP reassembles every rank's shards into one model."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source)
    model = auto_class.from_config(config, dtype=getattr(config, "dtype", None))
    state = model.state_dict()
    load_tensors(state, f"{source}/{SHARDED_MODEL_DIR}", alone=True)
    model.load_state_dict(state)
    return model


def _is_vision_language(source: str) -> bool:
    config = json.loads((Path(source) / "config.json").read_text())
    return "vision_config" in config


def _export_vision_language(role: str, source: str, target: str) -> str:
    """A vision-language policy loads as image-text-to-text, with its image processor
    (S-RUN-6). Its critic (backbone + value head, `models.model_io.BackboneValueModel`)
    has no Hugging Face class, so its role files are copied as saved."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    Path(target).mkdir(parents=True, exist_ok=True)
    if role == "critic":
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(Path(source) / name, Path(target) / name)
        return target
    AutoModelForImageTextToText.from_pretrained(source).save_pretrained(target)
    if (Path(source) / "tokenizer_config.json").exists():
        AutoTokenizer.from_pretrained(source).save_pretrained(target)
    if (Path(source) / "preprocessor_config.json").exists():
        AutoImageProcessor.from_pretrained(source).save_pretrained(target)
    return target


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
