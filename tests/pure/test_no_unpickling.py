"""No checkpoint file is unpickled as code (issue 16 item 8, S-SEC-2).

A boundary is read back on resume, possibly from shared storage others can write to.
Each `.pt` file of a role is replaced by a pickle whose `__reduce__` would create a
file if it ran; the load must be refused naming the file, and the file must not exist.
"""

from __future__ import annotations

import io
import os
import pickle
from types import SimpleNamespace

import pytest
import torch

from checkpoint.role_files import RoleCheckpointError
from checkpoint.role_state import OPTIMIZER_FILE, RNG_FILE, SCHEDULER_FILE, load_trainable_role, save_trainable_role


class _TinyModel(torch.nn.Linear):
    def __init__(self) -> None:
        super().__init__(3, 2)
        self.config = SimpleNamespace(to_json_string=lambda: "{}")


class _Payload:
    """Pickles as a call to os.system: running it is the attack."""

    def __init__(self, side_effect: str) -> None:
        self.side_effect = side_effect

    def __reduce__(self):
        return (os.system, (f"touch {self.side_effect}",))


def _trainer(seed: int = 0):
    torch.manual_seed(seed)
    model = _TinyModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


@pytest.mark.parametrize("name", [OPTIMIZER_FILE, SCHEDULER_FILE, RNG_FILE])
def test_a_malicious_pickle_in_a_boundary_is_refused_without_running(tmp_path, name):
    directory = str(tmp_path / "iter_000001" / "policy")
    model, optimizer, scheduler = _trainer()
    save_trainable_role(directory, role="policy", model=model, optimizer=optimizer, scheduler=scheduler,
                        trainer_state={"optimizer_step": 1})
    side_effect = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"state": _Payload(str(side_effect))}, buffer)  # the ordinary .pt container
    (tmp_path / "iter_000001" / "policy" / name).write_bytes(buffer.getvalue())

    fresh_model, fresh_optimizer, fresh_scheduler = _trainer(seed=1)
    with pytest.raises(RoleCheckpointError) as info:
        load_trainable_role(directory, model=fresh_model, optimizer=fresh_optimizer, scheduler=fresh_scheduler)
    assert f"{directory}/{name} is not a tensor-only torch file" in str(info.value)
    assert "posix.system" in str(info.value)  # what it would have called, not torch's advice to load unsafely
    assert not side_effect.exists()


def test_an_untouched_boundary_still_loads(tmp_path):
    directory = str(tmp_path / "policy")
    model, optimizer, scheduler = _trainer()
    save_trainable_role(directory, role="policy", model=model, optimizer=optimizer, scheduler=scheduler,
                        trainer_state={"optimizer_step": 1})
    fresh_model, fresh_optimizer, fresh_scheduler = _trainer(seed=1)
    state = load_trainable_role(directory, model=fresh_model, optimizer=fresh_optimizer, scheduler=fresh_scheduler)
    assert state["optimizer_step"] == 1
    assert torch.equal(fresh_model.weight, model.weight)


def test_a_malicious_dcp_metadata_is_refused_without_running(tmp_path):
    """A sharded role's `.metadata` (torch.distributed.checkpoint pickles it) is read
    through an unpickler that builds only DCP's metadata classes (S-SEC-2, S-SCALE-2)."""
    from checkpoint.dcp_io import UnsafeCheckpointFile, load_tensors, save_tensors

    model, _, _ = _trainer()
    directory = str(tmp_path / "model")
    save_tensors(model.state_dict(), directory)
    target = {name: torch.empty_like(tensor) for name, tensor in model.state_dict().items()}
    load_tensors(target, directory)  # the untouched folder loads
    assert all(torch.equal(target[name], tensor) for name, tensor in model.state_dict().items())

    side_effect = tmp_path / "pwned"
    (tmp_path / "model" / ".metadata").write_bytes(pickle.dumps(_Payload(str(side_effect))))
    with pytest.raises(UnsafeCheckpointFile, match=r"\.metadata is not DCP metadata: it names posix\.system"):
        load_tensors(target, directory)
    assert not side_effect.exists()
