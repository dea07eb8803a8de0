"""Saving and restoring one trainable role: model weights (safetensors), optimizer,
scheduler, trainer state and RNG, through fsspec paths.

A save is only *done* once re-read and found equal to the state in memory (S-CKPT-2).
Files hold host tensors, so a boundary written on a GPU node loads on a laptop; a load
copies into the live objects, keeping each tensor on its parameter's device.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from checkpoint.digest import state_digest
from checkpoint.role_files import (
    RoleCheckpointError,
    read_bytes,
    saving,
    torch_bytes,
    torch_load,
    write_file,
)
from checkpoint.role_layout import (  # noqa: F401 (the names of a role save, for its callers too)
    MODEL_FILE,
    OPTIMIZER_FILE,
    OPTIMIZER_PRUNED_NOTE,
    RNG_FILE,
    SCHEDULER_FILE,
    TRAINER_STATE_FILE,
)

# torch.distributed.checkpoint and FSDP are imported inside the trainer-only functions
# below: importing them costs about a second, and the data role and the command
# line's resume check use this module's file helpers without ever training.



@dataclass(frozen=True)
class RoleSaveReport:
    role: str
    path: str
    optimizer_step: int
    optimizer_pristine: bool
    model_digest: str
    optimizer_digest: str


def state_on_host(value: Any) -> Any:
    """`value` (nested dicts, lists, tuples) with every tensor copied to host memory."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: state_on_host(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(state_on_host(item) for item in value)
    return value


def trained_names(model: torch.nn.Module) -> set[str] | None:
    """The weights a role's boundary holds: all of the model's state (None) when every
    parameter trains, else only the parameters that train. A partly frozen model is one
    with LoRA adapters: its frozen base is the model at `model.path`, loaded again on
    every start, so a boundary holds the adapters and the value head alone (S-LORA-2)."""
    parameters = dict(model.named_parameters())
    trained = {name for name, parameter in parameters.items() if parameter.requires_grad}
    return None if len(trained) == len(parameters) else trained


def model_tensors(model: torch.nn.Module, only: set[str] | None = None) -> dict[str, torch.Tensor]:
    """Named host tensors with shared storage (tied embeddings) copied apart:
    safetensors refuses aliased tensors, and load_state_dict re-ties them on restore.
    Copied to the host in the same step (a GPU model's weights are written from there).
    `only`: these names alone (`trained_names`)."""
    return {
        name: tensor.detach().to("cpu", copy=True).contiguous()
        for name, tensor in model.state_dict().items()
        if only is None or name in only
    }


def check_trained_names(directory: str, saved: set[str], trained: set[str]) -> None:
    """A LoRA model's boundary must hold exactly what it trains (S-LORA-2): a boundary
    of a full fine-tuning run loaded into it (or one with other target modules) is
    refused naming a weight, instead of half loading."""
    missing, unexpected = sorted(trained - saved), sorted(saved - trained)
    if missing or unexpected:
        first = f"it lacks {missing[0]!r}" if missing else f"it holds {unexpected[0]!r}, which this model lacks"
        raise RoleCheckpointError(
            f"{directory} does not hold the weights this model trains ({first}; {len(missing)} missing, "
            f"{len(unexpected)} unexpected): was it saved with another model.lora setting?"
        )


def load_model_tensors(directory: str, model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Every saved weight into `model`; a LoRA model's frozen base stays as loaded."""
    trained = trained_names(model)
    if trained is not None:
        check_trained_names(directory, set(weights), trained)
    model.load_state_dict(weights, strict=trained is None)


def optimizer_state_for_save(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], bool]:
    """The optimizer state to write, keyed by parameter name (torch.distributed.checkpoint's
    format, which also covers sharded models), and whether the optimizer is pristine.

    `get_optimizer_state_dict` materialises a never-stepped optimizer (a zero-gradient
    step at lr 0: AdamW's `step` becomes 1, its moments appear). Saving in critic warmup
    must not change the actor (S-CW-7), so for a pristine optimizer that is rolled back
    and an empty state saved.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    pristine = not optimizer.state
    group_keys_before = [set(group) for group in optimizer.param_groups]
    state = get_optimizer_state_dict(model, optimizer)
    if pristine:
        optimizer.state.clear()
        for group, keys_before in zip(optimizer.param_groups, group_keys_before):
            for key in set(group) - keys_before:
                del group[key]
        state = {"state": {}, "param_groups": state["param_groups"]}
    return state, pristine


def save_model_only(directory: str, *, model: torch.nn.Module, tensors: dict[str, torch.Tensor] | None = None) -> str:
    """A partial (weights-only) save: an artifact, never a resume point (S-CKPT-5).
    `tensors`: the full weights when the model holds only a shard of them."""
    fs, root = fsspec.core.url_to_fs(directory)
    fs.makedirs(root, exist_ok=True)
    if tensors is None:
        tensors = model_tensors(model)
    else:
        tensors = {name: tensor.to("cpu", copy=True).contiguous() for name, tensor in tensors.items()}
    write_file(f"{directory}/{MODEL_FILE}", save_safetensors(tensors, metadata={"format": "pt"}))
    write_file(f"{directory}/config.json", model.config.to_json_string())
    return directory


def save_tokenizer(tokenizer: Any, directory: str) -> None:
    """Tokenizer files (and chat template) beside the weights, through fsspec."""
    with tempfile.TemporaryDirectory() as staging:
        tokenizer.save_pretrained(staging)
        for name in os.listdir(staging):
            with open(os.path.join(staging, name), "rb") as handle:
                write_file(f"{directory}/{name}", handle.read())


def save_trainable_role(
    directory: str,
    *,
    role: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    trainer_state: dict[str, Any],
) -> RoleSaveReport:
    tensors = model_tensors(model, only=trained_names(model))
    optimizer_state, pristine = optimizer_state_for_save(model, optimizer)
    if any(p.device.type != "cpu" for p in model.parameters()):
        optimizer_state = state_on_host(optimizer_state)  # a GPU trainer's moments; loadable anywhere
    with saving(role, directory):
        write_trainable_role_files(directory, model=model, optimizer_state=optimizer_state, scheduler=scheduler,
                                   trainer_state=dict(trainer_state, optimizer_pristine=pristine), tensors=tensors)
    report = RoleSaveReport(
        role=role,
        path=directory,
        optimizer_step=int(trainer_state["optimizer_step"]),
        optimizer_pristine=pristine,
        model_digest=state_digest(tensors),
        optimizer_digest=state_digest(optimizer_state),
    )
    verify_trainable_role(report)
    return report


def write_trainable_role_files(
    directory: str,
    *,
    model: torch.nn.Module,
    optimizer_state: dict[str, Any],
    scheduler: Any,
    trainer_state: dict[str, Any],
    tensors: dict[str, torch.Tensor],
) -> None:
    fs, root = fsspec.core.url_to_fs(directory)
    fs.makedirs(root, exist_ok=True)
    write_file(f"{directory}/{MODEL_FILE}", save_safetensors(tensors, metadata={"format": "pt"}))
    write_file(f"{directory}/config.json", model.config.to_json_string())
    write_file(f"{directory}/{OPTIMIZER_FILE}", torch_bytes(optimizer_state))
    write_file(f"{directory}/{SCHEDULER_FILE}", torch_bytes(scheduler.state_dict()))
    write_file(f"{directory}/{RNG_FILE}", torch_bytes({"torch": torch.get_rng_state()}))
    write_file(f"{directory}/{TRAINER_STATE_FILE}", json.dumps(trainer_state, indent=2, sort_keys=True))


def verify_trainable_role(report: RoleSaveReport) -> None:
    """Re-read every file and compare digests with what was in memory at save time."""
    directory = report.path
    tensors = load_safetensors(read_bytes(f"{directory}/{MODEL_FILE}"))
    if state_digest(tensors) != report.model_digest:
        raise RoleCheckpointError(f"{report.role}: {directory}/{MODEL_FILE} does not re-read to the saved weights")
    optimizer_state = torch_load(f"{directory}/{OPTIMIZER_FILE}")
    if state_digest(optimizer_state) != report.optimizer_digest:
        raise RoleCheckpointError(
            f"{report.role}: {directory}/{OPTIMIZER_FILE} does not re-read to the saved optimizer"
        )
    torch_load(f"{directory}/{SCHEDULER_FILE}")
    torch_load(f"{directory}/{RNG_FILE}")
    state = read_trainer_state(directory)
    if int(state.get("optimizer_step", -1)) != report.optimizer_step:
        raise RoleCheckpointError(f"{report.role}: {directory}/{TRAINER_STATE_FILE} records the wrong optimizer step")


def read_trainer_state(directory: str) -> dict[str, Any]:
    try:
        return json.loads(read_bytes(f"{directory}/{TRAINER_STATE_FILE}").decode())
    except json.JSONDecodeError as error:
        raise RoleCheckpointError(f"{directory}/{TRAINER_STATE_FILE} is not valid JSON: {error}") from None


def load_trainable_role(
    directory: str,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> dict[str, Any]:
    """Restore into live objects; returns the trainer state. A pristine optimizer's
    (empty) state is never loaded through a materialising target (S-CW-8): only its
    param_groups (where the learning rate lives) are restored."""
    # The marker is read before anything touches the optimizer: building a load
    # target through set_optimizer_state_dict would materialise state (S-CW-8).
    state = read_trainer_state(directory)
    fs, local = fsspec.core.url_to_fs(directory)
    if fs.exists(f"{local}/{OPTIMIZER_PRUNED_NOTE}"):
        raise RoleCheckpointError(
            f"{directory}: its optimizer state was removed by retention (rl.keep_optim_last); "
            "resume from the newest boundary, or export its weights with `python -m checkpoint.export`"
        )
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    from torch.distributed.fsdp import FSDPModule

    weights = load_safetensors(read_bytes(f"{directory}/{MODEL_FILE}"))
    optimizer_state = torch_load(f"{directory}/{OPTIMIZER_FILE}")
    if isinstance(model, FSDPModule):
        return _load_full_into_shards(state, model, optimizer, weights, optimizer_state, scheduler, directory)
    load_model_tensors(directory, model, weights)
    if state.get("optimizer_pristine"):
        restore_param_groups(optimizer, optimizer_state["param_groups"])
    else:
        set_optimizer_state_dict(model, optimizer, optimizer_state)
    scheduler.load_state_dict(torch_load(f"{directory}/{SCHEDULER_FILE}"))
    torch.set_rng_state(torch_load(f"{directory}/{RNG_FILE}")["torch"])
    return state


def restore_param_groups(optimizer: torch.optim.Optimizer, saved_groups: list[dict[str, Any]]) -> None:
    """A pristine optimizer's settings (the learning rate lives there) without its
    state (S-CW-8)."""
    for group, saved in zip(optimizer.param_groups, saved_groups):
        group.update({k: tuple(v) if k == "betas" else v for k, v in saved.items() if k != "params"})


def _load_full_into_shards(
    state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    weights: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    scheduler: Any,
    directory: str,
) -> dict[str, Any]:
    """A one-rank boundary loaded by FSDP2 ranks (S-SCALE-2): rank 0's full tensors
    are broadcast and each rank keeps its shard (torch's own full-state load path;
    every rank calls this at once)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    first = torch.distributed.get_rank() == 0
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    trained = trained_names(model)
    if trained is None:
        set_model_state_dict(model, weights if first else {}, options=options)
    else:
        # A LoRA model's boundary holds part of its state, which torch's broadcast
        # load does not take: every rank has read the files and each tensor is
        # scattered from rank 0 in turn, in one order on every rank (safetensors
        # hands its tensors back in no fixed order); the frozen base stays as loaded.
        check_trained_names(directory, set(weights), trained)
        options = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(model, dict(sorted(weights.items())), options=options)
        first = True
    if state.get("optimizer_pristine"):
        restore_param_groups(optimizer, optimizer_state["param_groups"])
    else:
        set_optimizer_state_dict(model, optimizer, optimizer_state if first else {}, options=options)
    scheduler.load_state_dict(torch_load(f"{directory}/{SCHEDULER_FILE}"))
    torch.set_rng_state(torch_load(f"{directory}/{RNG_FILE}")["torch"])
    return state
