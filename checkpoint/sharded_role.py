"""Saving and restoring a trainable role whose ranks hold FSDP2 shards (S-SCALE-2).

Every rank writes its own DCP shards and re-reads them before its save counts, so the
commit's `_SUCCESS` vouches for every rank's files. A load reshards to whatever ranks
load it, the single-file one-rank layout included. docs/checkpoints.md "Layout" shows
the files.
"""

from __future__ import annotations

import json
from typing import Any

import fsspec
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from checkpoint.dcp_io import METADATA_FILE, UnsafeCheckpointFile, load_tensors, save_tensors
from checkpoint.digest import state_digest
from checkpoint.role_layout import PARAM_GROUPS_FILE, SHARDED_MODEL_DIR, SHARDED_OPTIMIZER_DIR
from checkpoint.role_files import RoleCheckpointError, read_bytes, torch_bytes, torch_load, saving, write_file
from checkpoint.role_state import (
    OPTIMIZER_PRUNED_NOTE,
    RNG_FILE,
    SCHEDULER_FILE,
    TRAINER_STATE_FILE,
    RoleSaveReport,
    optimizer_state_for_save,
    read_trainer_state,
    restore_param_groups,
    trained_names,
)



def is_sharded_layout(directory: str) -> bool:
    fs, root = fsspec.core.url_to_fs(directory)
    return fs.exists(f"{root}/{SHARDED_MODEL_DIR}/{METADATA_FILE}")


def local_shards(value: Any) -> Any:
    """`value` with every DTensor replaced by this rank's shard: what a rank wrote."""
    if isinstance(value, DTensor):
        return value.to_local()
    if isinstance(value, dict):
        return {key: local_shards(item) for key, item in value.items()}
    return value


def _empty_like(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value)
    return {key: _empty_like(item) for key, item in value.items()}


def _verify(role: str, state: dict[str, Any], directory: str) -> str:
    """Re-read this rank's part of what was just saved; its digest, or a refusal."""
    digest = state_digest(local_shards(state))
    reread = _empty_like(state)
    try:
        load_tensors(reread, directory)
    except (UnsafeCheckpointFile, FileNotFoundError, RuntimeError) as error:
        raise RoleCheckpointError(f"{role}: {directory} does not re-read: {error}") from None
    if state_digest(local_shards(reread)) != digest:
        raise RoleCheckpointError(f"{role}: {directory} does not re-read to the saved state")
    return digest


def _json_groups(param_groups: list[dict[str, Any]]) -> str:
    return json.dumps([{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in param_groups])


def save_sharded_role(
    directory: str,
    *,
    role: str,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    trainer_state: dict[str, Any],
    model_config_json: str,
) -> RoleSaveReport:
    """Every rank calls this at once. Host tensors are written whatever the device:
    DCP stages device shards through the host itself."""
    model_state, _ = _model_state(model)
    optimizer_state, pristine = optimizer_state_for_save(model, optimizer)  # S-CW-7 holds sharded too
    with saving(role, directory):
        save_tensors(model_state, f"{directory}/{SHARDED_MODEL_DIR}")
        if not pristine:
            save_tensors(optimizer_state["state"], f"{directory}/{SHARDED_OPTIMIZER_DIR}")
        if rank == 0:
            write_file(f"{directory}/config.json", model_config_json)
            write_file(f"{directory}/{PARAM_GROUPS_FILE}", _json_groups(optimizer_state["param_groups"]))
            write_file(f"{directory}/{SCHEDULER_FILE}", torch_bytes(scheduler.state_dict()))
            write_file(f"{directory}/{RNG_FILE}", torch_bytes({"torch": torch.get_rng_state()}))
            state = dict(trainer_state, optimizer_pristine=pristine, sharded_ranks=_world())
            write_file(f"{directory}/{TRAINER_STATE_FILE}", json.dumps(state, indent=2, sort_keys=True))
    model_digest = _verify(role, model_state, f"{directory}/{SHARDED_MODEL_DIR}")
    optimizer_digest = (
        _verify(role, optimizer_state["state"], f"{directory}/{SHARDED_OPTIMIZER_DIR}") if not pristine else ""
    )
    return RoleSaveReport(
        role=role,
        path=directory,
        optimizer_step=int(trainer_state["optimizer_step"]),
        optimizer_pristine=pristine,
        model_digest=model_digest,
        optimizer_digest=optimizer_digest,
    )


def _model_state(model: torch.nn.Module) -> tuple[dict[str, Any], StateDictOptions | None]:
    """The model state a role's shards hold, and the options to load it back with. A
    LoRA model's hold only what trains (S-LORA-2, `trained_names`; torch's
    `ignore_frozen_params` keeps a frozen weight tied to another, so the names decide);
    the frozen base is loaded from `model.path` on every start."""
    trained = trained_names(model)
    if trained is None:
        return get_model_state_dict(model), None
    options = StateDictOptions(ignore_frozen_params=True, strict=False)
    state = get_model_state_dict(model, options=options)
    return {name: value for name, value in state.items() if name in trained}, options


def _world() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def load_sharded_role(
    directory: str, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> dict[str, Any]:
    """Every rank calls this at once; the ranks may be more or fewer than saved it."""
    state = read_trainer_state(directory)  # S-CW-8: the marker before the optimizer
    fs, root = fsspec.core.url_to_fs(directory)
    if fs.exists(f"{root}/{OPTIMIZER_PRUNED_NOTE}"):
        raise RoleCheckpointError(
            f"{directory}: its optimizer state was removed by retention (rl.keep_optim_last); "
            "resume from the newest boundary, or export its weights with `python -m checkpoint.export`"
        )
    model_state, options = _model_state(model)
    load_tensors(model_state, f"{directory}/{SHARDED_MODEL_DIR}")
    set_model_state_dict(model, model_state, options=options)
    groups = json.loads(read_bytes(f"{directory}/{PARAM_GROUPS_FILE}"))
    if state.get("optimizer_pristine"):
        restore_param_groups(optimizer, groups)
    else:
        # The load target: materialised with the right shapes and shards (its values
        # are all overwritten by the load below).
        target = get_optimizer_state_dict(model, optimizer)
        load_tensors(target["state"], f"{directory}/{SHARDED_OPTIMIZER_DIR}")
        for group in groups:
            if "betas" in group:
                group["betas"] = tuple(group["betas"])
        set_optimizer_state_dict(model, optimizer, {"state": target["state"], "param_groups": groups})
    scheduler.load_state_dict(torch_load(f"{directory}/{SCHEDULER_FILE}"))
    torch.set_rng_state(torch_load(f"{directory}/{RNG_FILE}")["torch"])
    return state


