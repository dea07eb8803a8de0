"""trainer/pinned_park.py moves buffers through nn.Module's public API (S-DEP-2): each
buffer, persistent or not, is replaced in the module that owns it and keeps its kind.
Without a GPU the host copies are plain clones (a GPU park: tests/services/test_gpu_roles.py)."""

from __future__ import annotations

import torch

from trainer.pinned_park import PinnedHostCopies, move_state


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.register_buffer("kept", torch.ones(3))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)
        self.register_buffer("absent", None)


class ClonedHostCopies(PinnedHostCopies):
    def to_host(self, slot, tensor):  # pinned memory needs a GPU
        return tensor.clone()


def test_every_buffer_is_replaced_and_keeps_whether_it_is_saved():
    model = torch.nn.Sequential(Block(), Block())
    optimizer = torch.optim.AdamW(model.parameters())
    before = {name: buffer for name, buffer in model.named_buffers()}
    saved = set(model.state_dict())
    # "cpu:0" is not the device of a plain CPU tensor ("cpu"), so every tensor goes to the host copies.
    placed = move_state(model, optimizer, torch.device("cpu", 0), ClonedHostCopies())
    after = dict(model.named_buffers())
    assert after.keys() == before.keys() == {"0.kept", "0.scratch", "1.kept", "1.scratch"}
    assert all(after[name] is not before[name] and torch.equal(after[name], before[name]) for name in after)
    assert set(model.state_dict()) == saved  # "scratch" still left out, "kept" still in
    assert model[0].absent is None
    assert placed == sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
