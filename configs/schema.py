"""The typed run configuration.

Every field carries a description because `docs/reference/config.md` is generated
from this module (CleanRL's one-help-string-per-hyperparameter discipline), and
because a user editing an override on the Prefect form should not need the source.
`extra="forbid"` everywhere: a misspelt key is an error naming its dotted path
(S-RUN-2), never a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from configs.callables import DOTTED_NAME, CallablePath
from configs.estimator_traits import estimator_traits, uses_critic
from configs.tool_call_format_names import DEFAULT_FORMAT, FORMAT_NAMES, known_format


_RUN_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TinyVisionSpec(Section):
    """The vision half of a tiny Qwen2.5-VL model (built instead of the text-only Qwen3
    when `model.tiny.vision` is set): small patches and small images so CPU runs stay fast."""

    hidden_size: int = Field(16, ge=4, description="Width of the tiny vision tower.")
    depth: int = Field(1, ge=1, description="Vision transformer blocks.")
    num_heads: int = Field(2, ge=1, description="Attention heads of the vision tower.")
    patch_size: int = Field(
        4, ge=1, description="Side of a square patch in pixels; images are resized to multiples of 2x this."
    )
    min_pixels: int = Field(
        64,
        ge=1,
        description="Images and video frames smaller than this many pixels are scaled up "
        "(image processor `size.shortest_edge`).",
    )
    max_pixels: int = Field(
        1024,
        ge=1,
        description="Images and video frames larger than this many pixels are scaled down "
        "(image processor `size.longest_edge`).",
    )
    tokens_per_second: int = Field(2, ge=1, description="m-RoPE temporal positions per second of video.")

    @model_validator(mode="after")
    def _pixel_range(self) -> "TinyVisionSpec":
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"model.tiny.vision.min_pixels ({self.min_pixels}) exceeds "
                f"model.tiny.vision.max_pixels ({self.max_pixels})"
            )
        return self


class TinyShapeSpec(Section):
    """The transformer shape of a locally built tiny Qwen3 (the policy's or the reward
    model's): one set of keys, so both read the same way."""

    hidden_size: int = Field(64, ge=8, description="Transformer width.")
    intermediate_size: int = Field(128, ge=8, description="MLP width.")
    num_hidden_layers: int = Field(2, ge=1, description="Number of decoder layers.")
    num_attention_heads: int = Field(4, ge=1, description="Attention heads.")
    num_key_value_heads: int = Field(2, ge=1, description="Key/value heads (grouped-query attention).")


class TinyModelSpec(TinyShapeSpec):
    """How to build the local tiny model when `model.path` does not exist yet."""

    task_alphabet: str = Field(
        "0123456789+-=*/(). #:abcdefghijklmnopqrstuvwxyz",
        description="Characters the character-level tokenizer knows besides its special tokens.",
    )
    max_position_embeddings: int = Field(256, ge=16, description="Longest sequence the tiny model accepts.")
    seed: int = Field(0, description="Seed for the tiny model's random initialisation (same seed, same bytes).")
    pretrain_task: Literal["none", "addition", "reverse", "tool_lookup"] = Field(
        "none",
        description="Supervised next-token pre-training when the tiny model is built: `addition` trains on the "
        "training side of the synthetic sums split (held-out sums are never seen), so PPO starts from a model "
        "that half-knows the task; `reverse` the same on the training side of the digit-reversal split; "
        "`tool_lookup` on whole episodes of the key-lookup task (call the `get` tool, answer with its result; "
        "training keys and values only), and gives the tokenizer Qwen3's tool-call template and tool tags; `none` "
        "keeps the random initialisation.",
    )
    pretrain_steps: int = Field(0, ge=0, description="Optimizer steps of that pre-training (0: none).")
    pretrain_batch_size: int = Field(64, ge=1, description="Examples per pre-training step.")
    pretrain_lr: float = Field(3e-3, gt=0, description="Peak AdamW learning rate of the pre-training (cosine decay).")
    pretrain_max_operand: int = Field(99, ge=1, description="`addition` pre-training: operands are drawn from 0..N.")
    pretrain_min_digits: int = Field(8, ge=1, description="`reverse` pre-training: shortest digit string.")
    pretrain_max_digits: int = Field(16, ge=1, description="`reverse` pre-training: longest digit string.")
    pretrain_period_fraction: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="`reverse` pre-training: the share of answers written with a trailing period, a base model's "
        "habit that an exact-match reward counts as wrong (so PPO has something to correct). `tool_lookup`: the "
        "share of episodes asked the bare question that answer 'unknown' instead of calling the tool (the same "
        "role: above 0.5, greedy decoding looks a value up only when the prompt says to).",
    )
    vision: TinyVisionSpec | None = Field(
        None,
        description="If set, the tiny model is a Qwen2.5-VL (this vision tower, the text settings above for its "
        "language model) with an image processor and vision tokens, instead of a text-only Qwen3.",
    )

    @model_validator(mode="after")
    def _pretrain_alphabet(self) -> "TinyModelSpec":
        if self.vision is not None and self.pretrain_task != "none":
            raise ValueError(
                f"model.tiny.pretrain_task is {self.pretrain_task!r}, but pre-training exists only for the text-only "
                "tiny model; set it to 'none' with model.tiny.vision"
            )
        if self.vision is not None and (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(
                "model.tiny.hidden_size / model.tiny.num_attention_heads must be even with model.tiny.vision "
                "(m-RoPE splits each head's rotary half into temporal, height and width sections)"
            )
        if self.pretrain_task == "addition":
            missing = sorted(set("0123456789+=") - set(self.task_alphabet))
            if missing:
                raise ValueError(
                    f"model.tiny.task_alphabet lacks {''.join(missing)!r}, which pretrain_task='addition' writes"
                )
        if self.pretrain_task == "reverse":
            written = "0123456789reverse " + ("." if self.pretrain_period_fraction else "")  # REVERSE_PROMPT too
            missing = sorted(set(written) - set(self.task_alphabet))
            if missing:
                raise ValueError(
                    f"model.tiny.task_alphabet lacks {''.join(missing)!r}, which pretrain_task='reverse' writes"
                )
            if self.pretrain_min_digits > self.pretrain_max_digits:
                raise ValueError(
                    f"model.tiny.pretrain_min_digits={self.pretrain_min_digits} exceeds "
                    f"model.tiny.pretrain_max_digits={self.pretrain_max_digits}"
                )
        if self.pretrain_task == "tool_lookup":
            # Keys, values, the prompts, the tools line, the tool-call JSON and the tool's
            # error replies (tests/pure/test_key_lookup_task.py renders episodes against it).
            written = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" + ' <>/_{}":,()'
            missing = sorted(set(written) - set(self.task_alphabet))
            if missing:
                raise ValueError(
                    f"model.tiny.task_alphabet lacks {''.join(missing)!r}, which pretrain_task='tool_lookup' writes"
                )
        return self


LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(Section):
    """Low-rank adapters (PEFT's LoRA) on the policy and the critic instead of training
    every weight (S-LORA-1): only the adapters, and the critic's value head, get
    gradients and optimizer state. docs/lora.md."""

    rank: int = Field(
        0, ge=0, description="Rank r of each adapter (B @ A, A of shape r x in); 0 turns LoRA off: every weight trains."
    )
    alpha: float = Field(
        16.0, gt=0, description="LoRA scaling numerator: the adapter's update is scaled by alpha / rank."
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input while training.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_DEFAULT_TARGETS),
        min_length=1,
        description="Linear layers that get adapters, matched as the last parts of module names (PEFT's rule); "
        "the default is the attention and MLP projections of Qwen3 and Qwen2.5.",
    )

    @field_validator("target_modules")
    @classmethod
    def _each_target_once(cls, value: list[str]) -> list[str]:
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated or not all(name.strip() for name in value):
            raise ValueError(f"model.lora.target_modules: {', '.join(repeated) or 'an empty name'} listed; "
                             "give each module name once")
        return value

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def record(self) -> str:
        """One line a boundary's marker keeps (a JSON scalar), so a resume under other
        adapters is refused by name."""
        return (f"rank={self.rank} alpha={self.alpha} dropout={self.dropout} "
                f"target_modules={','.join(self.target_modules)}")


class ModelConfig(Section):
    path: str = Field(
        description="Hugging Face model directory or hub id, loaded with from_pretrained "
        "by every role (policy, rollout, reference, critic)."
    )
    tiny: TinyModelSpec | None = Field(
        None,
        description="If set and `path` does not exist, build a tiny Qwen3 model (a Qwen2.5-VL with "
        "`model.tiny.vision`) and character tokenizer there first (CPU profile; no download).",
    )
    revision: str | None = Field(
        None,
        description="For a hub id in `path`: the branch, tag or commit to load. The launch resolves it (unset: the "
        "default branch) to a commit in the local Hugging Face cache and every role loads exactly that snapshot; "
        "the commit is part of the run's base-model fingerprint.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Parameter dtype for all roles."
    )
    attention: Literal["sdpa", "eager", "flash_attention_2", "flash_attention_3"] | None = Field(
        None,
        description="transformers' attention implementation for the policy, critic and reference (null: "
        "transformers' default, SDPA). With a flash-attention kernel (GPU, the flash-attn package) and "
        "rl.micro_batch_tokens, each micro-batch runs as one packed row without padding "
        "(docs/performance.md, \"Padding\").",
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="LoRA adapters on the policy and the critic (rank 0, the default: full fine-tuning).",
    )
    critic_path: str | None = Field(
        None,
        description="Start the critic from this folder instead of `path`: usually the reward model (its backbone "
        "and one-label score head become the critic's backbone and value head). It must share the policy's "
        "vocabulary; null: the critic starts from `path` with a new value head.",
    )


class DataPackerConfig(Section):
    """Which DataPacker turns projected prompts into model inputs (S-RUN-6)."""

    factory: CallablePath | None = Field(
        None,
        description="`package.module:callable` called as `factory(model_path, **factory_kwargs)` and returning a "
        "DataPacker (see docs/howto/custom-datapacker.md). Unset: the chat-template text packer for causal LMs, the "
        "Qwen-VL packer for Qwen2.5-VL models.",
    )
    factory_kwargs: dict[str, int | float | str | bool] = Field(
        default_factory=dict, description="Keyword arguments passed to `factory` after the model path."
    )


TRACKERS = ("tensorboard", "wandb", "mlflow")


class ExperienceConfig(Section):
    """The per-iteration samples the replay role writes to `<run>/experience/` (S-OPS-3)."""

    keep: Literal["off", "last", "all"] = Field(
        "last", description="`off` writes none, `last` keeps the newest `job.experience.last` iterations, `all` keeps "
        "every iteration's file.",
    )
    last: int = Field(100, ge=1, description="With keep=last: how many iterations' files stay on disk.")
    table_rows: int = Field(
        4, ge=0, description="Samples of each iteration shown in the Prefect UI's samples table (0: no table)."
    )


MAX_ITERATIONS_PER_BLOCK = 200
STOP_SHUTDOWN_MARGIN_S = 3.0  # of job.stop_grace_seconds, kept for releasing the actors and exiting
MIN_STOP_GRACE_S = STOP_SHUTDOWN_MARGIN_S + 2.0  # the margin plus the shortest commit (a tiny model's)


class JobConfig(Section):
    name: str = Field(
        "ppo-run",
        min_length=1,
        description="Run name: the output folder, the Prefect flow-run name and the Ray namespace.",
    )
    output_root: str = Field("outputs", description="Folder (or fsspec URL) under which `<job.name>/` is written.")
    seed: int = Field(0, description="Run seed: data shuffle, sampling and the update plan derive from it.")
    trackers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["tensorboard"],
        description="Where each metrics.jsonl row also goes, stepped by iteration: `tensorboard` (event files under "
        "`<run>/tensorboard/`, the default), `wandb` (offline, under `<run>/wandb/`; needs the `wandb` extra), "
        "`mlflow` (a local SQLite store `<run>/mlflow.db`; needs the `mlflow` extra). [] writes metrics.jsonl only.",
    )
    experience: ExperienceConfig = Field(
        default_factory=ExperienceConfig, description="Each iteration's samples kept as experience files."
    )
    stop_grace_seconds: float = Field(
        30.0,
        description="After SIGTERM or SIGINT (preemption, Ctrl-C, Cancel in the Prefect UI) the run finishes the "
        "iteration it is in, commits it and exits within this many seconds; past them, or at a second signal, it "
        "stops at once, keeping the previous boundary. It bounds one iteration, its commit "
        f"and the {STOP_SHUTDOWN_MARGIN_S:g} s kept for releasing the actors and exiting; at least "
        f"{MIN_STOP_GRACE_S:g}. The Kubernetes and Prefect worker default.",
    )
    trusted_modules: list[str] = Field(
        default_factory=list,
        description="Module prefixes (`my_pkg`, `my_pkg.rewards`) whose callables an override or a deployment "
        "parameter may name in a key that names code (the factories, `rl.reward.terminal_callable`), beside the "
        "project's own factory and reward modules. Only the profile sets it; a value written in the profile "
        "itself is trusted as it is (docs/reliability.md).",
    )
    time_limit_minutes: float | None = Field(
        None,
        gt=0,
        description="Stop cleanly at the first iteration end past this many minutes from the launch, committing "
        "that iteration; a rerun continues. Unset: no limit.",
    )
    iterations_per_block: int = Field(
        50,
        description="Iterations per block subflow in the Prefect UI: the run's graph is one node per block, each "
        f"block's graph its iterations' stage tasks. 1..{MAX_ITERATIONS_PER_BLOCK}.",
    )

    @field_validator("iterations_per_block")
    @classmethod
    def _block_fits_one_graph(cls, value: int) -> int:
        # A block's graph must stay far below the server's node limit (10,000 by
        # default: past it the UI draws nothing) and load in a second or two.
        if not 1 <= value <= MAX_ITERATIONS_PER_BLOCK:
            raise ValueError(
                f"job.iterations_per_block: {value} is outside 1..{MAX_ITERATIONS_PER_BLOCK}; a block of N iterations "
                "is one subflow run of about 10*N task runs, and the Prefect UI draws one graph per block"
            )
        return value

    @field_validator("trusted_modules")
    @classmethod
    def _module_prefixes(cls, value: list[str]) -> list[str]:
        for prefix in value:
            if not DOTTED_NAME.match(prefix):
                raise ValueError(f"job.trusted_modules: {prefix!r} is not a module name (e.g. 'my_pkg.rewards')")
        return value

    @field_validator("name")
    @classmethod
    def _one_path_segment(cls, value: str) -> str:
        # S-SEC-5: the name becomes a folder under job.output_root and the Ray namespace;
        # `..` or a separator would write outside the root.
        if not _RUN_NAME.match(value) or value in (".", ".."):
            raise ValueError(
                f"job.name: {value!r} must be one folder name: letters, digits, '.', '_' and '-' "
                "(no '/', no '..', no spaces)"
            )
        return value

    @field_validator("stop_grace_seconds")
    @classmethod
    def _grace_holds_a_commit(cls, value: float) -> float:
        # S-STOP-4: a grace the shutdown margin eats whole makes every stop a hard stop.
        if not value >= MIN_STOP_GRACE_S:
            raise ValueError(
                f"job.stop_grace_seconds: {value:g} leaves no time to commit the finished iteration (the last "
                f"{STOP_SHUTDOWN_MARGIN_S:g} s are kept for releasing the actors and exiting, so every stop would be a "
                f"hard stop); use at least {MIN_STOP_GRACE_S:g}, and size it to one iteration plus one commit"
            )
        return value

    @field_validator("trackers")
    @classmethod
    def _each_tracker_once(cls, value: list[str]) -> list[str]:
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"job.trackers: {', '.join(repeated)} listed more than once")
        return value


class DataConfig(Section):
    path: str | None = Field(
        None,
        description="Rows: a file of JSON rows (JSONL, JSON stream, JSON array, optionally gzip), a parquet file, "
        "a folder of parquet shards, or a `save_to_disk` folder (read through `datasets`); any fsspec URL.",
    )
    name: str | None = Field(
        None,
        description="Hugging Face dataset name or a local folder of data files, loaded with `datasets.load_dataset` "
        "(a `save_to_disk` folder or a parquet file goes in `path`).",
    )
    split: str = Field(
        "train",
        description="Split to read: of the dataset at `name`, of a DatasetDict folder at `path`, or of a parquet "
        "folder whose shard names carry splits (`train-00000.parquet`).",
    )
    factory: CallablePath | None = Field(
        None,
        description="`package.module:callable` returning an iterable of row dicts.",
    )
    factory_kwargs: dict[str, int | float | str | bool] = Field(
        default_factory=dict, description="Keyword arguments passed to `factory`."
    )
    prompt_key: str = Field("prompt", description="Row key holding the prompt (a string or a list of chat messages).")
    reference_key: str | None = Field(
        "reference",
        description="Row key holding the ground truth for rewards that need one; null if the data has none.",
    )
    shuffle: bool = Field(True, description="Shuffle rows each epoch (deterministic from job.seed and the epoch).")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> "DataConfig":
        chosen = [k for k in ("path", "name", "factory") if getattr(self, k)]
        if len(chosen) != 1:
            raise ValueError(
                "set exactly one of rl.data.path, rl.data.name, rl.data.factory "
                f"(got {', '.join('rl.data.' + k for k in chosen) or 'none'})"
            )
        return self


class ValidationConfig(Section):
    """Held-out evaluation during training (S-OPS-2): the current policy generates on the
    rollout engine for a fixed set of prompts, scored with the run's reward."""

    data: DataConfig = Field(
        description="Evaluation prompts, a source like rl.data (keep them out of the training data)."
    )
    every: int = Field(10, ge=0, description="Evaluate after every N-th iteration (0: never during training).")
    before_training: bool = Field(
        True, description="Also evaluate the starting policy, logged as iteration 0 of metrics.jsonl."
    )
    greedy: bool = Field(
        True, description="Greedy decoding (deterministic); false samples at rl.rollout.temperature with its own seed."
    )
    num_prompts: int | None = Field(
        None, ge=1, description="Evaluate on the first N prompts of the source (after its shuffle); null: all of them."
    )

    @model_validator(mode="after")
    def _runs_at_some_point(self) -> "ValidationConfig":
        if self.every == 0 and not self.before_training:
            raise ValueError(
                "rl.validation.every is 0 and rl.validation.before_training is false: the evaluation would never run; "
                "set one of them, or rl.validation=null to turn evaluation off"
            )
        return self


REWARD_COMBINE = ("model", "sum")


class TinyRewardModelSpec(TinyShapeSpec):
    """How to build the local tiny reward model when `rl.reward.model.path` does not
    exist yet: a one-label Qwen3 sequence classifier with the tiny policy's tokenizer,
    trained briefly on preference pairs from a rule-truth task (Bradley-Terry loss)."""

    task: Literal["copy_digit"] = Field(
        "copy_digit",
        description="Where the preference pairs come from: `copy_digit` prefers the prompt's digit over any other "
        "answer (the rule stays hidden from PPO; only the model's scores reach it).",
    )
    task_alphabet: str = Field("0123456789", description="Characters of the character-level tokenizer.")
    max_position_embeddings: int = Field(64, ge=16, description="Longest sequence it scores.")
    seed: int = Field(0, description="Seed of its initialisation and of the preference pairs.")
    train_steps: int = Field(500, ge=0, description="Optimizer steps on preference pairs (0: untrained).")
    train_batch_size: int = Field(64, ge=1, description="Preference pairs per step.")
    train_lr: float = Field(3e-3, gt=0, description="AdamW learning rate of that training.")


class RewardModelConfig(Section):
    """A learned reward model: a one-label sequence classifier whose score of
    the prompt and completion is the terminal reward. docs/rewards.md, "Reward models"."""

    path: str | None = Field(
        None,
        description="Folder (or hub id, pinned with `revision`) loadable with AutoModelForSequenceClassification, "
        "one label; scored in the reward role's actor with the folder's own tokenizer and chat template.",
    )
    revision: str | None = Field(
        None, description="For a hub id in `path`: the branch, tag or commit; pinned to a commit at launch."
    )
    url: str | None = Field(
        None,
        description="A served reward model (our `python -m models.reward_server`, or a vLLM server's `/classify`) "
        "instead of loading it here. Set only in the profile: an override or deployment parameter naming a URL is "
        "refused. With `path` too, `path` supplies the tokenizer and chat template the prompt is rendered with.",
    )
    served_name: str | None = Field(
        None, description="With `url`: the model name sent in each request (vLLM's `--served-model-name`)."
    )
    token_env: str | None = Field(
        None, description="With `url`: the environment variable holding the bearer token the server requires."
    )
    timeout_seconds: float = Field(30.0, gt=0, description="With `url`: seconds one request may take.")
    retries: int = Field(3, ge=0, description="With `url`: retries of a request after a transient error.")
    tiny: TinyRewardModelSpec | None = Field(
        None, description="If set and `path` does not exist, build and train a tiny reward model there first."
    )
    batch_size: int = Field(32, ge=1, description="Completions scored per forward (or per request when served).")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="The reward model's dtype.")
    max_length: int = Field(
        1024,
        ge=2,
        description="Longest prompt plus completion in the reward model's tokens; a longer one fails naming its row "
        "(never truncated: a truncated completion would be scored on what it did not say).",
    )
    combine: Literal["model", "sum"] = Field(
        "model",
        description="`model`: the terminal reward is the model's (shaped) score alone; a terminal rule, if set, is "
        "only measured (`reward/fraction_correct`). `sum`: the score times `weight` plus the rule's reward on PPO's "
        "scale (a rule is required).",
    )
    weight: float = Field(1.0, description="Factor on the model's shaped score in the terminal reward.")
    normalize: bool = Field(
        False,
        description="Running normalisation of the raw scores, (s - mean) / std over every score so far (kept in "
        "each boundary, so a resume continues it exactly).",
    )
    clip: float | None = Field(
        None, gt=0, description="After normalising: clip scores to [-clip, clip] (null: no clipping)."
    )
    missing_eos_penalty: float | None = Field(
        None,
        ge=0,
        description="Subtracted from the score of a completion that ends without EOS (TRL's missing_eos_penalty).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> "RewardModelConfig":
        if self.path is None and self.url is None:
            raise ValueError("rl.reward.model: set rl.reward.model.path (a model folder) or rl.reward.model.url")
        if self.url is None:
            named = [k for k in ("served_name", "token_env") if getattr(self, k) is not None]
            if named:
                raise ValueError(
                    f"rl.reward.model.{named[0]} applies to a served model only; set rl.reward.model.url or remove it"
                )
        elif not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"rl.reward.model.url: {self.url!r} is not an http:// or https:// URL")
        if self.tiny is not None and self.path is None:
            raise ValueError("rl.reward.model.tiny builds into rl.reward.model.path; set that path")
        return self


class RewardConfig(Section):
    terminal: str = Field(
        "arithmetic_exact_match",
        description="Terminal reward rule: PPO's `arithmetic_exact_match` or `none`, or a shared rule name.",
    )
    terminal_callable: CallablePath | None = Field(
        None, description="`package.module:callable` overriding PPO's matcher; not allowed with a shared rule."
    )
    correct_reward: float = Field(1.0, description="Reward for a correct completion (PPO's scale).")
    incorrect_reward: float = Field(0.0, description="Reward for an incorrect completion.")
    process: Literal["none", "linear"] = Field(
        "none", description="Per-token shaping term added beside the terminal reward."
    )
    on_error: Literal["fail", "zero"] = Field(
        "fail",
        description="When the terminal rule or callable raises on a completion: `fail` ends the run naming the "
        "callable, the row and the completion; `zero` scores it as incorrect, counts it in `reward/errors` and logs "
        "the first few.",
    )
    model: RewardModelConfig | None = Field(
        None, description="A learned reward model scoring each completion (docs/rewards.md); null: rules only."
    )

    @model_validator(mode="after")
    def _one_combination(self) -> "RewardConfig":
        """The one rule for mixing a model and a rule (docs/rewards.md): refused where
        two readings are possible, naming the keys."""
        if self.model is None:
            return self
        rule = self.terminal_callable is not None or self.terminal != "none"
        if self.model.combine == "sum" and not rule:
            raise ValueError(
                "rl.reward.model.combine=sum adds a rule's reward to the model's score, but rl.reward.terminal is "
                "none; name a rule in rl.reward.terminal, or use rl.reward.model.combine=model"
            )
        scale = [key for key, default in (("correct_reward", 1.0), ("incorrect_reward", 0.0))
                 if getattr(self, key) != default]
        if self.model.combine == "model" and scale:
            raise ValueError(
                f"rl.reward.{scale[0]} has no effect with rl.reward.model.combine=model (the rule is only measured, "
                "its reward never added); use rl.reward.model.combine=sum, or leave the rule's scale unset"
            )
        return self


class OptimizerConfig(Section):
    name: Literal["adamw", "adamw_foreach", "adamw_fused"] = Field(
        "adamw", description="AdamW variant: plain for-loop, foreach, or fused kernel."
    )
    policy_lr: float = Field(1e-3, gt=0, description="Policy learning rate.")
    critic_lr: float = Field(1e-3, gt=0, description="Critic learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm for both roles.")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warmup (optimizer steps) of both schedulers.")


class RolloutConfig(Section):
    engine: Literal["hf", "vllm"] = Field(
        "hf", description="Generation engine: transformers `generate` (CPU) or vLLM (GPU)."
    )
    max_new_tokens: int = Field(
        8,
        ge=1,
        description="Longest completion in tokens (single-turn; with `rl.env`, `rl.env.max_turn_tokens` bounds "
        "each turn instead).",
    )
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature (log-probs are of this tempered distribution)."
    )
    gpu_memory_utilization: float = Field(
        0.45, gt=0, le=1, description="vLLM: fraction of its GPU it may use (colocated with the trainer)."
    )
    weight_sync_bucket_mib: float = Field(
        256.0,
        gt=0,
        description="Largest bucket of full policy weights (MiB) gathered from the shards and sent to the engines "
        "at once; a larger single tensor is a bucket of its own.",
    )
    samples_per_prompt: int = Field(
        1,
        ge=1,
        description="Completions sampled for each prompt of an iteration (verl `rollout.n`, OpenRLHF "
        "`--n_samples_per_prompt`): an iteration holds rl.batch_size prompts times this many samples, the samples "
        "of one prompt side by side and sharing its group id, each a different random draw. rl.minibatch_size and "
        "rl.micro_batch_size count samples; rollout engines split the prompts, never a prompt's samples; "
        "evaluation still samples each prompt once (docs/reference/ppo-options.md).",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=1,
        description="Published policy versions a sample may lag behind the policy that trains on it. 0: synchronous "
        "PPO. 1: one step off, iteration N+1's batch is generated while iteration N trains.",
    )
    behaviour_weight_cap: float = Field(
        2.0,
        ge=1.0,
        description="One step off: each token's loss is weighted by pi_prox/pi_behav (the policy before this update "
        "over the one that sampled the token), truncated at this cap (decoupled PPO).",
    )
    engine_mismatch_cap: float | None = Field(
        None,
        ge=1.0,
        description="Correction for the gap between the engine's sampling log-probs and the trainer's: each token's "
        "policy loss is weighted by min(pi_old / pi_engine, cap), pi_old recomputed by the trainer and pi_engine the "
        "engine's probability of the sampled token (truncated importance sampling; verl "
        "`rollout_is_threshold` with token-level truncation, OpenRLHF `--enable_vllm_is_correction` with "
        "`--vllm_is_truncated_threshold`). At least 1; not with rl.rollout.max_staleness=1, whose weight "
        "already divides by the engine's log-probs (rl.rollout.behaviour_weight_cap is its cap). null: no weight.",
    )
    engine_timeout_seconds: float | None = Field(
        None,
        gt=0,
        description="With several engines: an engine call (a shard's generation, a weight load) that has not "
        "answered after this many seconds counts the engine as lost; it is killed, its shard generated again on "
        "a surviving engine and the engine replaced. Must be below rl.stage_timeout_seconds; null: a quarter of "
        "rl.stage_timeout_seconds (no deadline when that is null either).",
    )
    max_engine_replacements: int = Field(
        3,
        ge=0,
        description="With several engines: how many lost engines one run may replace before a further loss fails "
        "the rollout stage. 0 turns elastic rollout off (a lost engine fails the stage, as with one engine).",
    )

    @model_validator(mode="after")
    def _one_engine_correction(self) -> "RolloutConfig":
        # S-OPT-1: one step off, pi_prox/pi_behav already divides by the engine's log-probs, so
        # the engine-mismatch weight would be the same ratio twice; refused rather than merged.
        if self.engine_mismatch_cap is not None and self.max_staleness > 0:
            raise ValueError(
                f"rl.rollout.engine_mismatch_cap ({self.engine_mismatch_cap:g}) is set with "
                f"rl.rollout.max_staleness={self.max_staleness}: one step off, each token is already weighted by "
                "pi_prox/pi_behav with pi_behav the engine's own sampling log-probs, which corrects the engine "
                "mismatch as well; set its truncation with rl.rollout.behaviour_weight_cap and "
                "rl.rollout.engine_mismatch_cap=null"
            )
        return self


class EnvConfig(Section):
    """A multi-turn environment (S-ENV): each prompt row starts an episode in which the
    policy talks with the environment over several turns and calls its tools; the
    environment's step rewards are the run's rewards (docs/howto/environments.md)."""

    factory: CallablePath = Field(
        description="`package.module:callable` called as `factory(**factory_kwargs)` once per episode, returning an "
        "object with `reset(row, seed)` and `step(assistant_message)` (environments/protocol.py)."
    )
    factory_kwargs: dict[str, int | float | str | bool] = Field(
        default_factory=dict, description="Keyword arguments passed to `factory`."
    )
    max_turns: int = Field(
        4, ge=1, description="Assistant turns per episode; an episode still going after them is cut."
    )
    max_turn_tokens: int = Field(
        64, ge=1, description="Longest assistant turn in tokens; a turn that reaches it without EOS cuts the episode."
    )
    max_episode_tokens: int = Field(
        256,
        ge=1,
        description="Longest episode after its opening prompt, in tokens (assistant turns and observations); the "
        "episode is cut where it would pass it.",
    )
    step_timeout_seconds: float = Field(
        60.0, gt=0, description="A reset or step that has not returned after this many seconds is an error."
    )
    on_error: Literal["fail", "end"] = Field(
        "fail",
        description="When an environment raises, times out or returns a malformed answer: `fail` ends the rollout "
        "stage naming the environment, the row and the turn; `end` ends that episode with reward 0 and counts it in "
        "`env/errors`.",
    )
    max_concurrency: int = Field(
        64, ge=1, description="Environment steps (and the tool calls inside them) run at once, across episodes."
    )
    tool_call_format: str = Field(
        DEFAULT_FORMAT,
        description="How the model writes tool calls and in which role its chat template takes a tool's answer, "
        f"one of: {', '.join(f'`{name}`' for name in FORMAT_NAMES)} (`qwen3`: `<tool_call>` blocks, Qwen and "
        "Hermes-style templates; `llama3_json`: a bare JSON object with `parameters`, answers in role `ipython`, "
        "Llama 3.1-3.3; `mistral`: `[TOOL_CALLS]` and a JSON list, Mistral's v3 tokenizers, or "
        "`[TOOL_CALLS]name[ARGS]{...}`, its v11+ tokenizers). "
        "docs/howto/environments.md, \"Your model family's tool calls\".",
    )

    @field_validator("tool_call_format")
    @classmethod
    def _known_format(cls, name: str) -> str:
        known_format(name)  # S-BYO-5: an unknown name is refused listing the known ones
        return name

    @model_validator(mode="after")
    def _turn_fits_episode(self) -> "EnvConfig":
        if self.max_turn_tokens > self.max_episode_tokens:
            raise ValueError(
                f"rl.env.max_turn_tokens ({self.max_turn_tokens}) exceeds rl.env.max_episode_tokens "
                f"({self.max_episode_tokens})"
            )
        return self


class RLConfig(Section):
    max_steps: int = Field(20, ge=1, description="Outer PPO iterations in the run.")
    batch_size: int = Field(
        32,
        ge=1,
        description="Prompts per iteration, each sampled rl.rollout.samples_per_prompt times (once by default).",
    )
    epochs: int = Field(2, ge=1, description="Passes over the batch per iteration (update plan).")
    minibatch_size: int = Field(16, ge=1, description="Samples per optimizer step (update plan).")
    micro_batch_size: int = Field(
        16,
        ge=1,
        description="Samples per forward/backward; gradients accumulate up to a minibatch, and the minibatch's "
        "gradient does not depend on this cut. Ignored for cutting when rl.micro_batch_tokens is set.",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Cut each minibatch into length-grouped micro-batches of at most this many real tokens (prompt "
        "plus response of each row, shortest rows first), each trimmed to its own longest row; the minibatches "
        "are unchanged. Must hold the longest response (rl.rollout.max_new_tokens, or rl.env.max_episode_tokens) "
        "plus its prompt; a longer row is refused when the update meets it. null: rl.micro_batch_size samples "
        "per micro-batch, untrimmed.",
    )
    loss_aggregation: Literal[
        "token_mean", "sequence_mean_token_mean", "sequence_mean_token_sum", "sequence_mean_token_sum_norm"
    ] = Field(
        "token_mean",
        description="How the per-token policy and value losses become a minibatch's loss, over all its micro-batches "
        "and ranks: `token_mean` (every loss token of the minibatch weighs the same), `sequence_mean_token_mean` "
        "(each sequence's token mean, averaged over sequences), `sequence_mean_token_sum` (each sequence's token "
        "sum, averaged), `sequence_mean_token_sum_norm` (each sequence's token sum over a constant, the generation "
        "budget rl.rollout.max_new_tokens or rl.env.max_episode_tokens, averaged: Dr. GRPO). Part of the update "
        "plan's shape: a resume under another aggregation is refused (docs/reference/loss-aggregation.md).",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    clip_ratio: float = Field(0.2, gt=0, description="PPO policy ratio clip epsilon.")
    clip_ratio_high: float | None = Field(
        None,
        gt=0,
        description="Upper clip of the policy ratio, 1 + clip_ratio_high, when it differs from the lower one "
        "(clip-higher, DAPO; verl `clip_ratio_high`, OpenRLHF `--eps_clip_low_high`); not below rl.clip_ratio. "
        "null: rl.clip_ratio on both sides (docs/reference/ppo-options.md).",
    )
    dual_clip: float | None = Field(
        None,
        description="Dual clip (Ye et al. 2020; verl `clip_ratio_c`, OpenRLHF `--dual_clip`): on tokens with a "
        "negative advantage A the policy loss is capped at -dual_clip * A; must be above 1. null: no cap.",
    )
    value_clip: float = Field(0.2, gt=0, description="Value prediction clip around the old values.")
    kl_coef: float = Field(
        0.02,
        ge=0,
        description="Coefficient of the per-token KL to the frozen reference (in the reward or the loss: rl.kl_in); "
        "the starting value of the adaptive controller when rl.kl_target is set.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k1",
        description="Per-token estimator of KL(policy || reference) from the sampled tokens, with d = log pi - log "
        "pi_ref: `k1` = d, `k2` = d^2 / 2, `k3` = exp(-d) - 1 + d (Schulman's low-variance estimator; verl "
        "`low_var_kl`). Used for the reward penalty and for the loss term alike.",
    )
    kl_in: Literal["reward", "loss"] = Field(
        "reward",
        description="Where the KL to the reference acts: `reward` (a per-token penalty in the rewards before the "
        "advantages) or `loss` (no penalty in the rewards; rl.kl_coef times the estimator of KL(policy || "
        "reference) is added to each token's policy loss, with gradient: verl `use_kl_loss`, OpenRLHF "
        "`--use_kl_loss`).",
    )
    kl_target: float | None = Field(
        None,
        gt=0,
        description="Adaptive KL coefficient (Ziegler et al. 2019): after each iteration the coefficient is "
        "multiplied by 1 + clip(KL / kl_target - 1, -0.2, 0.2) * batch samples / rl.kl_horizon, KL being the batch's "
        "mean per-sequence estimate; reported as train/kl_coef and restored exactly on resume. null: rl.kl_coef "
        "stays fixed.",
    )
    kl_horizon: float | None = Field(
        None,
        gt=0,
        description="Horizon of the adaptive KL controller, in samples (verl `kl_ctrl.horizon`, OpenRLHF "
        "`--kl_horizon`); required with rl.kl_target.",
    )
    entropy_coef: float = Field(
        0.0,
        ge=0,
        description="Entropy bonus: entropy_coef times the entropy of the sampling distribution (at "
        "rl.rollout.temperature) is subtracted from each token's policy loss (verl `entropy_coeff`, OpenRLHF "
        "`--entropy_loss_coef`). 0: no bonus.",
    )
    advantage_estimator: str = Field(
        "gae",
        description="How advantages are estimated: `gae` (generalized advantage estimation over a learned critic), "
        "`grpo` (each sample's reward against its prompt's group: mean, and std with rl.grpo_scale), `rloo` "
        "(against the mean of the other samples of its prompt), `reinforce_plus_plus` (discounted per-token "
        "returns, whitened over the batch). All but gae start, train and commit no critic; grpo and rloo need "
        "rl.rollout.samples_per_prompt above 1 (verl `algorithm.adv_estimator`, OpenRLHF `--advantage_estimator`; "
        "docs/reference/ppo-options.md).",
    )
    grpo_scale: bool | None = Field(
        None,
        description="grpo only: divide each group-centred reward by the group's standard deviation (verl "
        "`norm_adv_by_std_in_grpo`); false keeps the centred reward (Dr. GRPO). null: true with grpo.",
    )
    whiten_advantages: bool | None = Field(
        None,
        description="Normalise advantages to zero mean, unit variance over the batch's sampled tokens. null: as "
        "the estimator defines it (gae and reinforce_plus_plus whiten; grpo and rloo, already normalised within "
        "each group, do not).",
    )
    critic_warmup_iterations: int = Field(
        0, ge=0, strict=True, description="Outer iterations 1..N train only the critic."
    )
    save_every: int = Field(
        5, ge=0, description="Commit a checkpoint boundary every N iterations (0: only the final one)."
    )
    save_final: bool = Field(True, description="Commit a boundary after the last iteration.")
    save_plan: Literal["full", "model"] = Field(
        "full",
        description="What cadence saves write: `full` (model + optimizer + training state, exact resume) or "
        "`model` (weights only, written under checkpoint_artifacts/ and never resumable).",
    )
    keep_optim_last: int | None = Field(
        None,
        ge=0,
        description="Keep optimizer state only in the newest K committed boundaries "
        "(unset: newest only; 0: keep all).",
    )
    stage_timeout_seconds: float | None = Field(
        3600.0,
        gt=0,
        description="A stage whose actor calls have not finished after this many seconds fails its task, naming the "
        "stage, the stuck role and this key, and the stuck actors are killed; null waits forever.",
    )
    threads_per_role: int = Field(
        1, ge=1, description="torch threads inside each role actor (1 is stable on a 2-core machine)."
    )
    colocated_offload: bool = Field(
        True,
        description="Colocated GPU placement only: the trainer parks its weights and optimizer state on the host while "
        "the rollout generates, and the engine sleeps while the trainer updates; false keeps both resident.",
    )
    weight_sync_transport: Literal["object_store", "nixl"] = Field(
        "object_store",
        description="How each published policy version reaches the engines: Ray's object store, or NIXL "
        "READs from the policy's registered memory (UCX; loopback-only on one node), with a version and checksum "
        "checked per bucket. Allowed with both placements (docs/weight-transport.md).",
    )
    data: DataConfig = Field(description="Prompt source (S-DATA).")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Reward rules (S-REW).")
    optimizer: OptimizerConfig = Field(
        default_factory=OptimizerConfig, description="Optimizer of both trainable roles."
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout engine settings.")
    validation: ValidationConfig | None = Field(
        None, description="Held-out evaluation as an `evaluate[iter=N]` task logging `val/*`; null: none."
    )
    env: EnvConfig | None = Field(
        None, description="A multi-turn environment with tools (S-ENV); null: one completion per prompt."
    )

    @property
    def generation_budget(self) -> int:
        """The most tokens one sample's response can hold, as configured: the constant C
        of `sequence_mean_token_sum_norm` (it depends on neither padding nor cutting) and
        the response part of the longest row `micro_batch_tokens` must hold."""
        return self.env.max_episode_tokens if self.env is not None else self.rollout.max_new_tokens

    @property
    def samples_per_iteration(self) -> int:
        """Rows of an iteration's batch: what rl.minibatch_size and the update plan count."""
        return self.batch_size * self.rollout.samples_per_prompt

    def named_samples(self) -> str:
        """The iteration's sample count as an error names it, by the keys that make it."""
        if self.rollout.samples_per_prompt == 1:
            return f"rl.batch_size {self.batch_size}"
        return (
            f"the {self.samples_per_iteration} samples of an iteration (rl.batch_size {self.batch_size} prompts × "
            f"rl.rollout.samples_per_prompt {self.rollout.samples_per_prompt})"
        )

    @model_validator(mode="after")
    def _plan_shape(self) -> "RLConfig":
        if self.minibatch_size > self.samples_per_iteration:
            raise ValueError(f"rl.minibatch_size ({self.minibatch_size}) exceeds {self.named_samples()}")
        if self.minibatch_size % self.micro_batch_size:
            raise ValueError(
                f"rl.minibatch_size ({self.minibatch_size}) must be a multiple of "
                f"rl.micro_batch_size ({self.micro_batch_size})"
            )
        return self

    @model_validator(mode="after")
    def _ppo_options(self) -> "RLConfig":
        """Option values that contradict each other or their definition (S-OPT-1), by key."""
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(
                f"rl.dual_clip is {self.dual_clip:g}: the dual clip caps a negative-advantage token's loss at "
                "-dual_clip * A, a bound on the policy ratio that needs a value above 1 (verl's default is 3); null "
                "turns it off"
            )
        if self.clip_ratio_high is not None and self.clip_ratio_high < self.clip_ratio:
            raise ValueError(
                f"rl.clip_ratio_high ({self.clip_ratio_high:g}) is below rl.clip_ratio ({self.clip_ratio:g}): "
                "clip-higher widens the upper clip only; set it to at least rl.clip_ratio, or null for a symmetric clip"
            )
        self._estimator_options()
        if self.kl_target is not None and self.kl_horizon is None:
            raise ValueError(
                f"rl.kl_target is {self.kl_target:g} but rl.kl_horizon is not set: the adaptive controller needs its "
                "horizon in samples (10000 in Ziegler et al. and verl); set rl.kl_horizon, or rl.kl_target=null for a "
                "fixed rl.kl_coef"
            )
        return self

    def _estimator_options(self) -> None:
        """An estimator's needs against the keys that contradict them, both keys named (S-OPT-2)."""
        estimator = estimator_traits(self.advantage_estimator)  # an unknown name lists the known ones
        name = f"rl.advantage_estimator={estimator.name}"
        samples = self.rollout.samples_per_prompt
        if estimator.uses_groups and samples < 2:
            raise ValueError(
                f"{name} compares the samples of one prompt, but rl.rollout.samples_per_prompt is {samples}: set "
                "rl.rollout.samples_per_prompt to 2 or more (4-16 is usual), or use rl.advantage_estimator=gae or "
                "reinforce_plus_plus"
            )
        if not estimator.uses_critic and self.critic_warmup_iterations:
            raise ValueError(
                f"{name} trains no critic, but rl.critic_warmup_iterations is {self.critic_warmup_iterations}: set "
                "rl.critic_warmup_iterations=0, or use rl.advantage_estimator=gae"
            )
        if self.grpo_scale is not None and estimator.name != "grpo":
            raise ValueError(
                f"rl.grpo_scale is set but {name}: it scales grpo's advantages only; remove it, or set "
                "rl.advantage_estimator=grpo"
            )

    @model_validator(mode="after")
    def _environment_rewards(self) -> "RLConfig":
        """With an environment its step rewards are the rewards: a second source is
        refused by key rather than silently ignored (docs/howto/environments.md)."""
        if self.env is None:
            return self
        if self.reward.model is not None:
            raise ValueError("rl.reward.model: a learned reward model does not score environment episodes; with rl.env "
                             "the environment's step rewards are the rewards (set rl.reward.model=null)")
        if self.reward.terminal_callable is not None:
            raise ValueError("rl.reward.terminal_callable: not used with rl.env (the environment's step rewards are "
                             "the rewards); score the answer in the environment's step instead")
        if self.reward.process != "none":
            raise ValueError("rl.reward.process: per-token shaping is not applied to environment episodes; set it to "
                             "none, or give turn rewards from the environment's step")
        return self


class GridConfig(Section):
    backend: Literal["ray", "local"] = Field(
        "ray", description="Who hosts the role bodies; PPO requires `ray`."
    )
    grouping: Literal["per_role", "single"] = Field(
        "per_role",
        description="Actor groups: one per role (per_role), or every role in one group (single, the seed's value for "
        "other algorithms); PPO requires per_role.",
    )
    gpu_placement: Literal["colocated", "disaggregated"] = Field(
        "colocated",
        description="Policy and rollout share one device group (colocated) or all four roles own one.",
    )
    gpus_per_node: int = Field(0, ge=0, description="GPUs the profile declares; 0 runs every role on CPU.")
    gpu_memory_gib: float | None = Field(
        None,
        gt=0,
        description="Memory of each GPU in GiB (80 for an 80 GB H100), read only by `--validate-manifest`'s memory "
        "estimate: it turns vLLM's rl.rollout.gpu_memory_utilization into GiB and adds a note for a device group "
        "estimated over it. null: the estimate is printed, not compared.",
    )
    num_nodes: int = Field(
        1,
        ge=1,
        description="Nodes the device groups spread over (grid.gpus_per_node GPUs each); above 1, each group is "
        "pinned to a node of the joined cluster, as CPU bundles on a CPU run.",
    )
    rollout_tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="GPUs per vLLM engine (tensor parallel); must divide the rollout's GPUs and fit on one node.",
    )
    policy_gpus: int = Field(0, ge=0, description="GPUs in the policy (and, colocated, rollout) device group.")
    rollout_gpus: int = Field(0, ge=0, description="GPUs of the rollout group when disaggregated.")
    reference_gpus: int = Field(0, ge=0, description="GPUs of the frozen reference group.")
    critic_gpus: int = Field(0, ge=0, description="GPUs of the critic group.")
    reward_placement: Literal["with_reference", "own"] = Field(
        "with_reference",
        description="Where a loaded reward model (rl.reward.model.path without url) runs: beside the frozen "
        "reference in its device group (both frozen; each takes half of each GPU bundle), or in a group of its own "
        "with grid.reward_gpus. On a CPU run either way is the host.",
    )
    reward_gpus: int = Field(
        0, ge=0, description="GPUs of the reward model's own group (grid.reward_placement=own); 0: the host."
    )
    cpu_trainer_ranks: int = Field(
        1,
        ge=1,
        description="Data-parallel ranks (gloo) of a trainer whose group has no GPU; a GPU group has one rank per GPU.",
    )
    cpu_rollout_engines: int = Field(
        1,
        ge=1,
        description="Rollout engines (actors, each a shard of every batch) of a rollout group with no GPU; "
        "a GPU group has one per grid.rollout_tensor_parallel_size GPUs.",
    )
    cpu_reference_ranks: int = Field(
        1,
        ge=1,
        description="Ranks (gloo) of the frozen reference when its group has no GPU, its model sharded over them "
        "(FSDP2); a GPU group has one rank per GPU.",
    )
    ray_address: str | None = Field(
        None, description="Join this Ray cluster instead of starting a local one (RAY_ADDRESS also works)."
    )
    ray_num_cpus: int | None = Field(2, ge=1, description="CPUs given to a locally started Ray (None: all of them).")


OBJECT_STORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2")


LOCKABLE_SCHEMES = ("file", "local")  # fsspec schemes that are paths on a mounted filesystem


class PPOConfig(Section):
    job: JobConfig = Field(default_factory=JobConfig, description="Run identity and outputs.")
    model: ModelConfig = Field(description="The model every role loads.")
    rl: RLConfig = Field(description="PPO algorithm, data, reward and rollout.")
    data_packer: DataPackerConfig = Field(
        default_factory=DataPackerConfig,
        description="How prompts become model inputs: tokens, and pixels for VLMs.",
    )
    grid: GridConfig = Field(default_factory=GridConfig, description="Backend and device placement.")

    @model_validator(mode="after")
    def _critic_keys_need_a_critic(self) -> "PPOConfig":
        """A critic-free estimator refuses the keys that only a critic reads, both named (S-OPT-2)."""
        if uses_critic(self.rl.advantage_estimator):
            return self
        name = f"rl.advantage_estimator={self.rl.advantage_estimator}"
        if self.model.critic_path is not None:
            raise ValueError(
                f"model.critic_path is set but {name} starts no critic: remove model.critic_path, or use "
                "rl.advantage_estimator=gae"
            )
        if self.grid.critic_gpus:
            raise ValueError(
                f"grid.critic_gpus is {self.grid.critic_gpus} but {name} starts no critic: set grid.critic_gpus=0, "
                "or use rl.advantage_estimator=gae"
            )
        return self

    @model_validator(mode="after")
    def _local_store_for_multi_role_checkpoints(self) -> "PPOConfig":
        scheme = self.job.output_root.split("://", 1)[0] if "://" in self.job.output_root else "file"
        if scheme in OBJECT_STORE_SCHEMES:
            # S-CKPT-7: policy, critic and data publish into one boundary; an object store
            # has no atomic rename for the marker and pointer, so refuse before any worker.
            raise ValueError(
                f"job.output_root: {self.job.output_root!r} is an object store ({scheme}://); multi-role "
                "checkpoints need a local or shared filesystem path"
            )
        if scheme not in LOCKABLE_SCHEMES:
            # S-SEC-5: the run lock and the atomic renames need a filesystem path; any
            # other scheme would put the lock at a relative path on this machine's disk.
            raise ValueError(
                f"job.output_root: {self.job.output_root!r} uses {scheme}://, where the run lock and the commit "
                "protocol's atomic renames cannot be kept; use a local or shared filesystem path (or file://)"
            )
        return self
