"""LoRA adapters through the in-process runner on a wider tiny Qwen3 (hidden 256, MLP
1024, 4 layers): what a boundary holds (S-LORA-2), exact resume (S-LORA-2, S-CKPT-8),
the merged weights the engines load and the export (S-LORA-3).

The runs are made once for the module: a full fine-tuning iteration (the optimizer
size to compare with), an uninterrupted 4-iteration LoRA run, and a LoRA run stopped
after iteration 2 and rerun to 4."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoint.boundary import CheckpointError
from checkpoint.export import ADAPTER_DIR, export_boundary
from rundir.preflight import config_problems
from configs.loading import load_config
from flows.in_process import run_in_process
from rundir.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE
from tests.support.helpers import boundary, metric_records, optimizer_state, weights_digest, without_timings

WIDE = ("model.tiny.hidden_size=256", "model.tiny.intermediate_size=1024", "model.tiny.num_hidden_layers=4")
LORA = ("model.lora.rank=8",)


def _config(root: Path, model_dir: Path, name: str, *extra: str):
    return load_config(TINY_PROFILE, [
        f"job.output_root={root}", f"model.path={model_dir}", f"job.name={name}", *WIDE, "rl.batch_size=16",
        "rl.minibatch_size=8", "rl.micro_batch_size=8", "rl.epochs=1", "rl.save_every=2", "rl.validation=null",
        *extra,
    ])


def _run(root: Path, model_dir: Path, name: str, *extra: str) -> Path:
    config = _config(root, model_dir, name, *extra)
    run_in_process(config, paths=RunPaths.for_config(config), resume=True)
    return root / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    model_dir = root / "wide-tiny-qwen3"  # built by the first run, from model.tiny
    full = _run(root, model_dir, "full", "rl.max_steps=1")
    straight = _run(root, model_dir, "straight", "rl.max_steps=4", *LORA)
    _run(root, model_dir, "resumed", "rl.max_steps=2", *LORA)
    resumed = _run(root, model_dir, "resumed", "rl.max_steps=4", *LORA)
    return {"model": model_dir, "full": full, "straight": straight, "resumed": resumed, "root": root}


def _state_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_state_bytes(item) for item in value.values())
    return 0


def test_a_lora_boundary_holds_the_adapters_and_a_tenth_of_the_optimizer_state(runs):
    """S-LORA-2: rank 8 on the wider tiny model keeps the policy's AdamW state under 10%
    of full fine-tuning's; the weights saved are the adapters (and the critic's head)."""
    full = _state_bytes(optimizer_state(boundary(runs["full"], 1) / "policy")["state"])
    lora = _state_bytes(optimizer_state(boundary(runs["straight"], 4) / "policy")["state"])
    assert 0 < lora <= 0.10 * full, (lora, full)
    policy = load_file(boundary(runs["straight"], 2) / "policy" / "model.safetensors")
    assert policy and all(".lora_A." in name or ".lora_B." in name for name in policy)
    critic = load_file(boundary(runs["straight"], 2) / "critic" / "model.safetensors")
    assert {name for name in critic if "lora_" not in name} == {
        "base_model.model.score.modules_to_save.default.weight", "base_model.model.score.modules_to_save.default.bias"
    }  # S-LORA-1: the value head trains whole


def test_lora_stop_and_rerun_is_bitwise_the_uninterrupted_run(runs):
    """S-LORA-2 with S-CKPT-8: the frozen base comes back from model.path, the adapters
    and their optimizer from the boundary."""
    for role in ("policy", "critic"):
        assert weights_digest(boundary(runs["resumed"], 4) / role) == weights_digest(
            boundary(runs["straight"], 4) / role
        ), role
    got = [without_timings(r) for r in metric_records(runs["resumed"])]
    assert got == [without_timings(r) for r in metric_records(runs["straight"])]
    assert all(r["perf/weight_sync_bytes"] > 0 for r in got)  # the engine took merged weights every version


def test_the_export_is_a_merged_model_and_a_peft_adapter(runs):
    """S-LORA-3: `from_pretrained` loads the merged policy (no adapter weights), which
    differs from the starting model; PEFT loads the adapter over the base to the same
    model; the critic's value head is the trained one."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    out = runs["root"] / "export"
    export_boundary(str(boundary(runs["straight"], 4)), str(out))
    recorded = json.loads((boundary(runs["straight"], 4) / "_SUCCESS").read_text())["loop_state"]["base_model"]
    assert json.loads((out / "policy" / ADAPTER_DIR / "base_model.json").read_text())["digest"] == recorded  # S-SEC-4
    assert not [n for n in load_file(out / "policy" / "model.safetensors") if "lora_" in n or "base_model" in n]
    merged = AutoModelForCausalLM.from_pretrained(out / "policy")
    start = AutoModelForCausalLM.from_pretrained(runs["model"])
    start_weights = start.state_dict()
    changed = [n for n, w in merged.state_dict().items() if not torch.equal(w, start_weights[n])]
    assert any("q_proj" in n for n in changed) and not any("norm" in n for n in changed)

    adapted = PeftModel.from_pretrained(start, out / "policy" / ADAPTER_DIR)
    ids = torch.tensor([[3, 9, 14, 20, 5, 11, 7]])
    with torch.no_grad():
        torch.testing.assert_close(adapted(input_ids=ids).logits, merged(input_ids=ids).logits, rtol=1e-4, atol=1e-4)

    critic = AutoModelForTokenClassification.from_pretrained(out / "critic")
    saved = load_file(boundary(runs["straight"], 4) / "critic" / "model.safetensors")
    assert torch.equal(critic.score.weight, saved["base_model.model.score.modules_to_save.default.weight"])


def test_target_modules_the_model_lacks_are_refused_before_a_run(runs):
    config = _config(runs["root"], runs["model"], "bad", *LORA, 'model.lora.target_modules=["q_proj","qkv"]')
    problems = [str(p) for p in config_problems(config)]
    assert problems == [p for p in problems if p.startswith("model.lora.target_modules: qkv name(s) no module")]
    assert len(problems) == 1 and "q_proj" in problems[0]  # it lists what the model does have


def test_published_weights_are_the_merged_model_under_the_base_names():
    """S-LORA-3: what weight sync gathers for the engines is PEFT's own merge, named as
    the plain model names its weights (the engine refuses any other name)."""
    from configs.schema import LoraConfig
    from models.lora import add_adapters
    from tests.in_process.fsdp_ranks import small_qwen3
    from trainer.sharding import full_weights

    plain_names = list(small_qwen3().state_dict())
    model = add_adapters(small_qwen3(), LoraConfig(rank=4, alpha=8), seed=0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.normal_()  # PEFT starts B at zero: merged would equal the base
    published = full_weights(model, keep=True)
    expected = model.merge_and_unload().state_dict()
    assert list(published) == plain_names
    for name, tensor in published.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-6, atol=1e-6, msg=name)


def test_adapters_on_modules_the_model_lacks_are_refused_naming_the_key():
    from configs.schema import LoraConfig
    from models.lora import add_adapters
    from tests.in_process.fsdp_ranks import small_qwen3

    with pytest.raises(ValueError, match=r"model.lora.target_modules: c_attn name\(s\) no module"):
        add_adapters(small_qwen3(), LoraConfig(rank=4, target_modules=["q_proj", "c_attn"]), seed=0)


def test_a_full_boundary_is_refused_by_a_lora_model_and_a_weights_only_save_is_merged(runs, tmp_path):
    """S-LORA-2: a boundary of another kind of run is refused naming a weight, never
    half loaded; S-LORA-3: `rl.save_plan=model` artifacts load as plain models."""
    from transformers import AutoModelForCausalLM

    from checkpoint.role_files import RoleCheckpointError
    from configs.schema import LoraConfig, OptimizerConfig
    from models.lora import add_adapters
    from models.model_io import load_causal_lm
    from trainer.update_runtime import UpdateRuntime

    model = add_adapters(load_causal_lm(str(runs["model"]), "float32"), LoraConfig(rank=8), seed=0)
    runtime = UpdateRuntime("policy", model, OptimizerConfig(), lr=1e-3)
    with pytest.raises(RoleCheckpointError, match=r"does not hold the weights this model trains \(it lacks '"):
        runtime.load(str(boundary(runs["full"], 1) / "policy"))
    runtime.save_model(str(tmp_path / "artifact"))
    assert not [n for n in load_file(tmp_path / "artifact" / "model.safetensors") if "lora_" in n]
    AutoModelForCausalLM.from_pretrained(tmp_path / "artifact")


@pytest.mark.parametrize("changed", ["model.lora.alpha=32", "model.lora.rank=0"])
def test_resuming_under_another_lora_setting_is_refused_and_writes_nothing(runs, changed):
    """S-LORA-2: a boundary holds adapters for one setting (or full weights); the resume
    check refuses another before any role starts, naming the key."""
    from rundir.resume import ResumeError
    from tests.support.helpers import run_dir_snapshot

    before = run_dir_snapshot(runs["straight"])
    refusal = r"written with model.lora rank=8 alpha=16.0 .* but this run is configured with model.lora rank="
    with pytest.raises(ResumeError, match=refusal):
        _run(runs["root"], runs["model"], "straight", "rl.max_steps=5", *LORA, changed)
    assert run_dir_snapshot(runs["straight"]) == before


def test_an_export_refuses_to_merge_onto_another_base(runs, tmp_path):
    """S-SEC-4: the base at the path PEFT recorded changed since training (one tensor):
    the export refuses instead of merging the adapters onto it."""
    base = tmp_path / "base"
    shutil.copytree(runs["model"], base)
    weights = load_file(base / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-3
    save_file(weights, base / "model.safetensors", metadata={"format": "pt"})
    copied = tmp_path / "checkpoints" / "iter_000004"
    shutil.copytree(boundary(runs["straight"], 4), copied)
    for role in ("policy", "critic"):
        adapter_config = copied / role / "adapter_config.json"
        settings = json.loads(adapter_config.read_text())
        adapter_config.write_text(json.dumps({**settings, "base_model_name_or_path": str(base)}))
    with pytest.raises(CheckpointError, match=r"first differing file: model.safetensors\).*original base model back"):
        export_boundary(str(copied), str(tmp_path / "export"))
    assert not (tmp_path / "export" / "policy").exists()
