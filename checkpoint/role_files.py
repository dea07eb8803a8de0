"""Writing and reading the files of a role's save through fsspec, with the failures
named by role and path: the commit task's failure is all the user sees of a failed
save. Tensor files load with `weights_only`, so nothing in a checkpoint is unpickled
as code (S-SEC-2). Kept apart from role_state.py's model and optimizer logic because
the data role, the in-flight batch and the command line's resume check need only
these."""

from __future__ import annotations

import io
import pickle
from contextlib import contextmanager
from typing import Any, Iterator

import fsspec
import torch

from files.durable import write_synced


class RoleCheckpointError(RuntimeError):
    pass


class RoleSaveFailed(RoleCheckpointError):
    """A write into a role's folder failed part way. It names the role and the file,
    because the commit task's failure is all the user sees of it (S-FAULT-1): a bare
    `OSError: No space left on device` names neither."""


def write_file(path: str, payload: bytes | str) -> None:
    """One file of a role's save, fsynced before it returns (S-CKPT-9); the commit
    syncs the folders before the marker vouches for it."""
    try:
        write_synced(path, payload)
    except Exception as error:
        raise RoleSaveFailed(f"writing {path} failed: {type(error).__name__}: {error}") from error


@contextmanager
def saving(role: str, directory: str) -> Iterator[None]:
    """Every failure of a role's save names the role (and the file, or the folder)."""
    try:
        yield
    except RoleSaveFailed as error:
        raise RoleSaveFailed(f"{role}: {error}") from error.__cause__
    except RoleCheckpointError:
        raise  # verification errors name the role already
    except Exception as error:
        raise RoleSaveFailed(f"{role}: saving into {directory} failed: {type(error).__name__}: {error}") from error


def read_bytes(path: str) -> bytes:
    try:
        with fsspec.open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise RoleCheckpointError(f"missing checkpoint file {path}") from None


def torch_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def torch_load(path: str) -> Any:
    """A `.pt` file of tensors and plain containers. weights_only: nothing in a
    checkpoint is unpickled as code (S-SEC-2); a file holding anything else (a
    malicious `__reduce__`, a damaged archive) is refused naming it."""
    payload = read_bytes(path)
    try:
        # map_location: a file that does hold device tensors still opens without a GPU.
        return torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError) as error:
        # torch's own message suggests weights_only=False; name only what was refused.
        lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
        reason = next((line for line in lines if "GLOBAL" in line or "WeightsUnpickler" in line), lines[0])
        reason = reason.removeprefix("WeightsUnpickler error: ").rstrip(".").split(". ")[0]
        raise RoleCheckpointError(
            f"{path} is not a tensor-only torch file and was not loaded ({reason}); "
            "only weights_only=True loads are allowed"
        ) from None
