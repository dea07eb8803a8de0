"""`--validate-manifest` (S-RUN-3): the public 4-GPU profile checks on this CPU
machine, every broken variant is refused naming its key, all problems are listed at
once, and nothing is allocated (no Ray, no weights)."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import time

import pytest

from configs.loading import load_config
from cli.manifest import check_manifest, validate_manifest
from tests.conftest import REPO_ROOT, TINY_PROFILE

PUBLIC_PROFILE = str(REPO_ROOT / "configs" / "ppo_qwen06b_public_4gpu.py")
SHARED_RULE_CALLABLE = "tests.pure.test_rewards:half_credit"
# The public profile with tests/ trusted, for overrides naming the callables of tests/ (S-SEC-3).
TRUSTING_PUBLIC_PROFILE = str(REPO_ROOT / "tests" / "support" / "profiles" / "public_trusting_tests.py")


def run_validate(profile: str, overrides: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = validate_manifest(profile, overrides, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def error_keys(stderr: str) -> list[str]:
    return [line.removeprefix("error: ").split(":", 1)[0] for line in stderr.splitlines() if line.startswith("error: ")]


@pytest.fixture
def public_overrides(tmp_path) -> list[str]:
    # Outputs in a temp folder so the check never depends on what earlier runs left.
    return [f"job.output_root={tmp_path / 'outputs'}"]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


# --- the public profile ------------------------------------------------------------


def test_public_profile_validates_on_cpu(public_overrides):
    import ray

    ray_was_running = ray.is_initialized()  # another test's session cluster may be up
    started = time.perf_counter()
    code, out, err = run_validate(PUBLIC_PROFILE, public_overrides)
    elapsed = time.perf_counter() - started
    assert code == 0, err
    assert out.rstrip().endswith("bind_check: ok")
    assert "colocated [policy+rollout: 2 GPUs; reference: 1 GPU; critic: 1 GPU] on 4 GPU(s)" in out
    # the second policy GPU trains and generates too
    assert "data parallel: policy 2 ranks, critic 1 rank, rollout 2 engines" in out
    assert "engine vllm" in out
    # Qwen/Qwen3-0.6B is a hub id with no local copy: skipped with a note, never downloaded.
    assert "not in the local Hugging Face cache" in out
    assert ray.is_initialized() == ray_was_running  # S-RUN-3: validation starts no Ray
    assert elapsed < 5.0, f"validation took {elapsed:.2f} s"


def test_validation_in_a_fresh_process_never_imports_ray_or_torch(tmp_path):
    code = (
        "import sys, time\n"
        "t = time.perf_counter()\n"
        "from cli.manifest import validate_manifest\n"
        f"rc = validate_manifest({PUBLIC_PROFILE!r}, ['job.output_root={tmp_path}'])\n"
        "print('elapsed', time.perf_counter() - t)\n"
        "print('imported', sorted(m for m in ('ray', 'torch', 'transformers', 'prefect', 'vllm') "
        "if m in sys.modules))\n"
        "sys.exit(rc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "bind_check: ok" in result.stdout
    assert "imported []" in result.stdout, result.stdout


def test_cli_validate_manifest_exits_zero_with_bind_check_ok(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "cli.manifest", "--config", PUBLIC_PROFILE, "--", f"job.output_root={tmp_path}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("bind_check: ok")


def test_cli_through_the_flow_module_reports_every_problem(tmp_path):
    """The documented command, `python -m flows.ppo ... --validate-manifest`, with two
    broken settings: both are named and the exit code is non-zero."""
    result = subprocess.run(
        [sys.executable, "-m", "flows.ppo", "--config", PUBLIC_PROFILE, "--validate-manifest", "--",
         f"job.output_root={tmp_path}", "grid.backend=local", "grid.gpus_per_node=2"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
    )
    assert result.returncode != 0
    assert set(error_keys(result.stderr)) == {"grid.backend", "grid.gpus_per_node"}, result.stderr
    assert "bind_check: ok" not in result.stdout


# --- broken variants, each named by its key -------------------------------------------


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["rl.critic_warmup_iterations=-1"], "rl.critic_warmup_iterations"),  # negative warmup (S-CW-1)
        (["rl.optimizer.warmup_steps=-5"], "rl.optimizer.warmup_steps"),
        (["grid.backend=local"], "grid.backend"),  # S-RUN-5
        (["job.output_root=s3://b/x"], "job.output_root"),  # object store, multi-role (S-CKPT-7)
        (["grid.gpus_per_node=2"], "grid.gpus_per_node"),  # 2+1+1 GPUs needed
        (["grid.num_nodes=1", "grid.gpus_per_node=3"], "grid.gpus_per_node"),
        (
            ["rl.reward.terminal=gsm8k", f"rl.reward.terminal_callable={SHARED_RULE_CALLABLE}"],
            "rl.reward.terminal_callable",
        ),  # S-REW-4
        (["rl.reward.terminal_callable=tests.pure.test_rewards:no_such_function"], "rl.reward.terminal_callable"),
        (["rl.learning_rate=0.1"], "rl.learning_rate"),  # unknown key (S-RUN-2)
        (["grid.rollout_gpus=1"], "grid.rollout_gpus"),  # colocated: rollout shares the policy's GPUs
        (["grid.gpu_placement=disaggregated"], "grid.rollout_gpus"),  # four groups, rollout has none
        (["grid.policy_gpus=0"], "grid.policy_gpus"),  # the trainer and engine need a GPU in a GPU run
        (["grid.rollout_tensor_parallel_size=3"], "grid.rollout_tensor_parallel_size"),  # 2 GPUs, TP 3
        (["rl.data.reference_key=null"], "rl.data.reference_key"),  # arithmetic rule needs a reference
        (["rl.minibatch_size=48", "rl.micro_batch_size=8"], "rl.minibatch_size"),  # 256 % 48
        (["rl.data.factory=data.synthetic:no_such_factory"], "rl.data.factory"),
        (["rl.data.factory_kwargs={\"rows\": 3}"], "rl.data.factory_kwargs"),
        (["rl.data.prompt_key=question"], "rl.data.prompt_key"),
    ],
)
def test_broken_variant_fails_naming_its_key(public_overrides, overrides, key):
    code, out, err = run_validate(PUBLIC_PROFILE, public_overrides + overrides)
    assert code != 0
    assert key in error_keys(err), err
    assert "bind_check: ok" not in out


def test_minibatch_must_split_evenly_over_data_parallel_ranks(public_overrides):
    # Three policy GPUs are three data-parallel ranks: a minibatch of 64 cannot be
    # split into equal shards (64 % 3 == 1) although it divides the batch.
    overrides = public_overrides + [
        "grid.gpus_per_node=8",
        "grid.policy_gpus=3",
        "rl.batch_size=256",
        "rl.minibatch_size=64",
        "rl.micro_batch_size=8",
    ]
    code, _, err = run_validate(PUBLIC_PROFILE, overrides)
    assert code != 0
    assert "3 data-parallel ranks of the policy" in err


def test_every_problem_is_listed_not_just_the_first(public_overrides):
    overrides = public_overrides + [
        "grid.backend=local",
        "grid.gpus_per_node=2",
        "rl.reward.terminal=gsm8k",
        f"rl.reward.terminal_callable={SHARED_RULE_CALLABLE}",
        "rl.minibatch_size=48",
        "rl.micro_batch_size=8",
    ]
    code, out, err = run_validate(TRUSTING_PUBLIC_PROFILE, overrides)
    assert code != 0
    assert set(error_keys(err)) == {
        "grid.backend",
        "grid.gpus_per_node",
        "rl.reward.terminal_callable",
        "rl.minibatch_size",
    }
    assert "bind_check: failed (4 problem(s)" in out


def test_config_errors_are_all_listed_too(public_overrides):
    code, out, err = run_validate(
        PUBLIC_PROFILE, public_overrides + ["rl.critic_warmup_iterations=-1", "rl.max_steps=0"]
    )
    assert code == 2
    assert set(error_keys(err)) == {"rl.critic_warmup_iterations", "rl.max_steps"}
    assert "bind_check: failed" in out


# --- data: every row of a file, row 0 of a factory ------------------------------------------


def test_data_file_every_row_is_read_and_counted(tmp_path, public_overrides):
    rows = [{"prompt": f"{i}+1=", "reference": str(i + 1)} for i in range(7)]
    path = write_jsonl(tmp_path / "prompts.jsonl", rows)
    code, out, err = run_validate(PUBLIC_PROFILE, public_overrides + [f"rl.data.path={path}"])
    assert code == 0, err
    assert "data_rows: 7" in out.splitlines()


def test_gzip_array_file_counts_too(tmp_path, public_overrides):
    path = tmp_path / "prompts.json.gz"
    path.write_bytes(gzip.compress(json.dumps([{"prompt": "1+1=", "reference": 2}] * 3).encode()))
    code, out, err = run_validate(PUBLIC_PROFILE, public_overrides + [f"rl.data.path={path}"])
    assert code == 0, err
    assert "data_rows: 3" in out.splitlines()


def test_first_bad_row_fails_with_its_position(tmp_path, public_overrides):
    path = tmp_path / "prompts.jsonl"
    good = json.dumps({"prompt": "1+1=", "reference": "2"})
    # row 2 (line 3) has an empty prompt; row 4 is not JSON at all and must not be reported
    path.write_text("\n".join([good, good, json.dumps({"prompt": "", "reference": "3"}), good, "{oops"]) + "\n")
    code, out, err = run_validate(PUBLIC_PROFILE, public_overrides + [f"rl.data.path={path}"])
    assert code != 0
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, errors
    assert errors[0].startswith("error: rl.data.path:")
    assert "row 2 (line 3, column 1)" in errors[0]
    assert "data_rows" not in out


def test_unreadable_row_names_row_line_and_column(tmp_path, public_overrides):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "1+1=", "reference": "2"}\n{"prompt": "2+2=", "reference": "4"}{"prompt": "x"}\n')
    code, _, err = run_validate(PUBLIC_PROFILE, public_overrides + [f"rl.data.path={path}"])
    assert code != 0
    assert "rl.data.path" in error_keys(err)
    assert "row 2 (line 2" in err


def test_missing_data_file_names_the_key(tmp_path, public_overrides):
    code, _, err = run_validate(PUBLIC_PROFILE, public_overrides + [f"rl.data.path={tmp_path / 'nope.jsonl'}"])
    assert code != 0
    assert error_keys(err) == ["rl.data.path"]


def test_parquet_and_saved_dataset_rows_are_every_one_read_and_counted(tmp_path, public_overrides):
    # S-BYO-4: through `datasets`, into the same projection and count as JSONL rows.
    datasets = pytest.importorskip("datasets")
    rows = [{"prompt": f"{i}+1=", "reference": str(i + 1)} for i in range(6)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    datasets.DatasetDict(train=datasets.Dataset.from_list(rows)).save_to_disk(str(tmp_path / "saved"))
    for path in (tmp_path / "rows.parquet", tmp_path / "saved"):
        code, out, err = run_validate(PUBLIC_PROFILE, public_overrides + [f"rl.data.path={path}"])
        assert code == 0, err
        assert "data_rows: 6" in out.splitlines()
    code, _, err = run_validate(
        PUBLIC_PROFILE, public_overrides + [f"rl.data.path={tmp_path / 'saved'}", "rl.data.split=test"]
    )
    assert error_keys(err) == ["rl.data.path"]
    assert "without the split 'test' (rl.data.split); its splits: train" in err


def test_a_bad_parquet_row_is_refused_with_its_row_number_and_key(tmp_path, public_overrides):
    datasets = pytest.importorskip("datasets")
    rows = [{"prompt": "1+1=", "reference": "2"}] * 2 + [{"prompt": "", "reference": "3"}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    code, out, err = run_validate(PUBLIC_PROFILE, public_overrides + [f"rl.data.path={tmp_path / 'rows.parquet'}"])
    assert code != 0 and "data_rows" not in out
    assert f"error: rl.data.path: {tmp_path / 'rows.parquet'} row 2: `prompt` is an empty string" in err


def test_a_dataset_name_that_cannot_give_rows_is_refused_before_ray(tmp_path, public_overrides):
    datasets = pytest.importorskip("datasets")
    code, _, err = run_validate(PUBLIC_PROFILE, public_overrides + ["rl.data.name=parquet"])
    assert code != 0 and error_keys(err) == ["rl.data.name"]
    assert "Set rl.data.path to your file or folder instead" in err
    folder = tmp_path / "mydata"
    folder.mkdir()
    datasets.Dataset.from_list([{"prompt": "1+1=", "reference": "2"}]).to_parquet(str(folder / "train.parquet"))
    code, out, err = run_validate(PUBLIC_PROFILE, public_overrides + [f"rl.data.name={folder}"])
    assert code == 0, err
    overrides = [f"rl.data.name={folder}", "rl.data.split=validation"]
    code, _, err = run_validate(PUBLIC_PROFILE, public_overrides + overrides)
    assert error_keys(err) == ["rl.data.split"]
    assert "no split 'validation' (rl.data.split); the splits `datasets` finds there, from its file names: train" in err


def test_reward_needing_a_reference_names_the_rule_and_the_column(tmp_path, public_overrides):
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    code, _, err = run_validate(PUBLIC_PROFILE, public_overrides + [f"rl.data.path={path}", "rl.reward.terminal=gsm8k"])
    assert code != 0
    assert error_keys(err) == ["rl.data.reference_key"]
    assert "'gsm8k'" in err and "column 'reference'" in err and "row 0" in err


def test_reference_key_pointing_at_the_right_column_passes(tmp_path, public_overrides):
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    overrides = [f"rl.data.path={path}", "rl.reward.terminal=gsm8k", "rl.data.reference_key=answer"]
    code, out, err = run_validate(PUBLIC_PROFILE, public_overrides + overrides)
    assert code == 0, err
    assert "data_rows: 1" in out.splitlines()


def test_rule_without_needs_passes_on_data_without_a_reference_column(tmp_path, public_overrides):
    # S-REW-2: nonempty needs no reference, so data without the column is fine as it is.
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "hello"}])
    code, out, err = run_validate(
        PUBLIC_PROFILE, public_overrides + [f"rl.data.path={path}", "rl.reward.terminal=nonempty"]
    )
    assert code == 0, err
    assert "data_rows: 1" in out.splitlines()


def test_callable_declaring_no_reference_needs_no_column(tmp_path, public_overrides):
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "hello"}])
    overrides = [f"rl.data.path={path}", "rl.reward.terminal_callable=tests.pure.test_rewards:says_hello",
                 "rl.data.reference_key=null"]
    code, _, err = run_validate(TRUSTING_PUBLIC_PROFILE, public_overrides + overrides)
    assert code == 0, err


# --- model config, read without weights -----------------------------------------------------


def write_model_config(folder, **fields) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 28,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "max_position_embeddings": 40960,
    }
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))
    # The rest of a folder the pre-flight asks for (files/model_folder.py): weights it
    # does not open, a tokenizer it does.
    from tokenizers import Tokenizer, models

    (folder / "model.safetensors").write_bytes(b"")
    Tokenizer(models.WordLevel({"a": 0, "</s>": 1}, unk_token="a")).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return str(folder)


def test_local_model_config_is_read_and_checked_against_tensor_parallelism(tmp_path, public_overrides):
    model = write_model_config(tmp_path / "qwen", num_attention_heads=6, num_key_value_heads=3)
    overrides = public_overrides + [f"model.path={model}", "grid.gpus_per_node=8", "grid.policy_gpus=4",
                                    "grid.rollout_tensor_parallel_size=4"]
    code, out, err = run_validate(PUBLIC_PROFILE, overrides)
    assert code != 0
    assert error_keys(err) == ["grid.rollout_tensor_parallel_size", "grid.rollout_tensor_parallel_size"], err
    assert "6 attention heads" in err and "3 key/value heads" in err
    assert "Qwen3ForCausalLM; 28 layers" in out


def test_completion_longer_than_the_context_is_refused(tmp_path, public_overrides):
    model = write_model_config(tmp_path / "short", max_position_embeddings=32)
    code, _, err = run_validate(
        PUBLIC_PROFILE, public_overrides + [f"model.path={model}", "rl.rollout.max_new_tokens=64"]
    )
    assert code != 0
    assert error_keys(err) == ["rl.rollout.max_new_tokens"]


def test_local_model_folder_without_config_is_refused(tmp_path, public_overrides):
    (tmp_path / "empty").mkdir()
    code, _, err = run_validate(PUBLIC_PROFILE, public_overrides + [f"model.path={tmp_path / 'empty'}"])
    assert code != 0
    assert error_keys(err) == ["model.path"]


# --- the CPU profile, and options that contradict each other ----------------------------------


def test_tiny_cpu_profile_validates_and_notes_the_model_build(tmp_path):
    overrides = [f"job.output_root={tmp_path}", f"model.path={tmp_path / 'model-not-built-yet'}"]
    code, out, err = run_validate(TINY_PROFILE, overrides)
    assert code == 0, err
    assert "built there from model.tiny at start-up" in out
    assert "CPU only" in out
    assert not (tmp_path / "model-not-built-yet").exists()  # validation builds nothing


def test_reference_and_critic_may_stay_on_the_host_of_a_one_gpu_node(public_overrides):
    overrides = public_overrides + [
        "grid.gpus_per_node=1",
        "grid.policy_gpus=1",
        "grid.reference_gpus=0",
        "grid.critic_gpus=0",
    ]
    code, out, err = run_validate(PUBLIC_PROFILE, overrides)
    assert code == 0, err
    assert "grid.critic_gpus=0: the critic runs on the host" in out


def test_cpu_run_declaring_group_gpus_is_refused(tmp_path):
    code, _, err = run_validate(TINY_PROFILE, [f"job.output_root={tmp_path}", "grid.critic_gpus=1"])
    assert code != 0
    assert error_keys(err) == ["grid.critic_gpus"]


def test_output_root_that_is_a_file_is_refused(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, _, err = run_validate(TINY_PROFILE, [f"job.output_root={blocker}"])
    assert code != 0
    assert error_keys(err) == ["job.output_root"]


def test_ray_address_from_the_environment_is_reported_not_contacted(tmp_path):
    config = load_config(PUBLIC_PROFILE, [f"job.output_root={tmp_path}"])
    report = check_manifest(config, environ={"RAY_ADDRESS": "ray://head.example:10001"})
    assert report.ok, report.problems
    assert any("joins the cluster at ray://head.example:10001 (RAY_ADDRESS" in line for line in report.summary)


# --- meshes (issue 17 item 7, S-SCALE-1) --------------------------------------------


def test_the_manifest_prints_each_roles_mesh(tmp_path):
    code, out, err = run_validate(TINY_PROFILE, [f"job.output_root={tmp_path}", "grid.cpu_trainer_ranks=2"])
    assert code == 0, err
    assert "mesh: policy: 2 ranks on cpu (gloo), FSDP2 shard 2" in out
    assert "mesh: critic: 2 ranks on cpu (gloo), FSDP2 shard 2" in out and "x 1 replica" in out
    assert "mesh: reference: 1 rank on cpu, unsharded" in out
    code, out, err = run_validate(TINY_PROFILE, [f"job.output_root={tmp_path}", "grid.cpu_reference_ranks=2"])
    assert code == 0, err
    # S-SCALE-1: the frozen reference shards its weights alone.
    assert "mesh: reference: 2 ranks on cpu (gloo), FSDP2 shard 2 (each rank holds 1/2 of weights (frozen))" in out
    assert "mesh: policy: 1 rank on cpu, unsharded" in out


def test_a_trainer_mesh_that_does_not_fit_whole_nodes_is_refused(public_overrides):
    overrides = public_overrides + ["grid.num_nodes=2", "grid.gpus_per_node=4", "grid.policy_gpus=6",
                                    "rl.batch_size=288", "rl.minibatch_size=48"]
    code, out, err = run_validate(PUBLIC_PROFILE, overrides)
    assert code != 0
    assert "grid.policy_gpus: is 6: the policy spans nodes of grid.gpus_per_node=4 GPUs" in err
    assert "use a multiple of 4" in err


def test_a_mesh_over_two_whole_nodes_is_hsdp(public_overrides):
    overrides = public_overrides + ["grid.num_nodes=2", "grid.gpus_per_node=4", "grid.policy_gpus=8",
                                    "rl.batch_size=256", "rl.minibatch_size=64"]
    code, out, err = run_validate(PUBLIC_PROFILE, overrides)
    assert "mesh: policy: 8 ranks on cuda (nccl), HSDP shard 4" in out and "x 2 replicas" in out


# --- a manifest that describes the run it will start (issue 59 items 5 and 6) ------------------

# The project's own environment and its rows: the pre-flight opens its episodes (S-BYO-5).
ENV_OVERRIDES = ["rl.env.factory=environments.key_lookup:make_environment",
                 "rl.data.factory=data.synthetic:key_lookup_split", "rl.data.factory_kwargs={\"num_rows\": 8}",
                 "rl.env.max_turns=3", "rl.env.max_turn_tokens=40", "rl.env.max_episode_tokens=200"]


def test_an_environment_run_is_described_by_its_episodes_not_by_max_new_tokens(tmp_path):
    from models.tiny_model import build_tokenizer

    model = write_model_config(tmp_path / "chat", max_position_embeddings=512)
    build_tokenizer("0123456789").save_pretrained(model)  # a ChatML template: renders tool messages
    # rl.rollout.max_new_tokens at the model's positions: refused for one completion per
    # prompt, not used by episodes (rl.env.max_turn_tokens bounds each turn).
    overrides = [f"job.output_root={tmp_path}", f"model.path={model}", "model.tiny=null",
                 "rl.rollout.max_new_tokens=512", *ENV_OVERRIDES]
    code, out, err = run_validate(TINY_PROFILE, overrides)
    assert code == 0, err
    rollout = next(line for line in out.splitlines() if line.startswith("rollout:"))
    assert "one completion per prompt" not in rollout and "max_new_tokens 512" not in rollout
    assert "environment environments.key_lookup:make_environment()" in rollout
    assert "at most 3 assistant turns (rl.env.max_turns)" in rollout
    assert "40 tokens each (rl.env.max_turn_tokens)" in rollout
    assert "200 tokens after the opening (rl.env.max_episode_tokens)" in rollout
    assert "tool calls in the qwen3 format (rl.env.tool_call_format)" in rollout
    assert "episode openings: the longest of 1 measured is " in out  # row 0 of the factory, opened here
    # The same key still refuses a single-turn run.
    code, _, err = run_validate(TINY_PROFILE, overrides[:4])
    assert code != 0 and error_keys(err) == ["rl.rollout.max_new_tokens"]


def test_the_update_keys_are_described_when_they_are_not_the_defaults(tmp_path):
    code, out, err = run_validate(TINY_PROFILE, [f"job.output_root={tmp_path}"])
    assert code == 0, err
    assert "loss:" not in out and "micro-batches:" not in out
    assert "max_new_tokens 1, one completion per prompt" in out
    code, out, err = run_validate(TINY_PROFILE, [f"job.output_root={tmp_path}", "rl.micro_batch_tokens=512",
                                                 "rl.loss_aggregation=sequence_mean_token_sum_norm",
                                                 "rl.rollout.max_new_tokens=16"])
    assert code == 0, err
    assert "loss: sequence_mean_token_sum_norm (rl.loss_aggregation, constant 16 tokens)" in out
    assert "micro-batches: at most 512 tokens each" in out


def _served(config, *, path=None):
    from configs.schema import RewardModelConfig

    served = RewardModelConfig(url="http://127.0.0.1:9", path=path, normalize=True)
    reward = config.rl.reward.model_copy(update={"model": served})
    return config.model_copy(update={"rl": config.rl.model_copy(update={"reward": reward})})


@pytest.fixture
def answering_server(monkeypatch):
    from models.reward_client import RewardClient

    monkeypatch.setattr(RewardClient, "check", lambda self: "my-reward")


def test_the_served_reward_model_url_is_in_the_manifest(tmp_path, answering_server):
    rows = write_jsonl(tmp_path / "rows.jsonl", [{"question": "1+1=", "answer": "2"}])
    config = _served(load_config(TINY_PROFILE, [f"job.output_root={tmp_path}", f"rl.data.path={rows}",
                                                "rl.data.prompt_key=question", "rl.data.reference_key=answer"]))
    report = check_manifest(config)
    assert report.ok, report.problems
    assert ("reward model: served at http://127.0.0.1:9 (rl.reward.model.url); prompt and completion sent as "
            "plain text (no rl.reward.model.path); combine=model (normalised (running))") in report.summary


def test_a_served_reward_model_without_a_folder_on_conversation_prompts_is_refused(tmp_path, answering_server):
    conversation = [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1="}]
    rows = write_jsonl(tmp_path / "rows.jsonl", [{"messages": "2+2=", "answer": "4"},
                                                 {"messages": conversation, "answer": "2"}])
    overrides = [f"job.output_root={tmp_path}", f"rl.data.path={rows}", "rl.data.prompt_key=messages",
                 "rl.data.reference_key=answer"]
    report = check_manifest(_served(load_config(TINY_PROFILE, overrides)))
    assert report.keys() == ["rl.reward.model.path"], report.problems
    message = str(report.problems[0])
    assert "row 1" in message and "'messages'" in message and "rl.reward.model.url=http://127.0.0.1:9" in message
    assert "Set rl.reward.model.path to the served model's folder" in message
    # Plain-text prompts need no folder.
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"messages": "2+2=", "answer": "4"}])
    report = check_manifest(_served(load_config(TINY_PROFILE, overrides + [f"rl.data.path={plain}"])))
    assert report.ok, report.problems
