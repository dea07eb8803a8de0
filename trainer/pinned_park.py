"""Moving a trainer's whole state between its GPU and page-locked host buffers
(S-RUN-4: the colocated policy parks on the host while the rollout generates).

Not `Module.to("cpu")`, which allocates pageable memory at every park that the driver
stages through a pinned bounce buffer: here each tensor keeps one pinned buffer, reused,
and all copies are queued then synchronised once. Assigning `.data` keeps every
`Parameter` the one the optimizer holds; the price is a pinned host copy of the state.
"""

from __future__ import annotations

from typing import Hashable, Iterator

import torch


class PinnedHostCopies:
    def __init__(self) -> None:
        self._buffers: dict[Hashable, torch.Tensor] = {}

    def to_host(self, slot: Hashable, tensor: torch.Tensor) -> torch.Tensor:
        """Queue a device-to-host copy of `tensor` into this slot's pinned buffer."""
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._buffers[slot] = buffer
        buffer.copy_(tensor, non_blocking=True)
        return buffer


def optimizer_state_slots(optimizer: torch.optim.Optimizer) -> Iterator[tuple[Hashable, dict, str]]:
    """(slot, state, key) for every optimizer state tensor that moves with the model.

    A per-parameter `step` that torch keeps on the host (AdamW neither fused nor
    capturable: reading it on the device would sync every step) stays on the host:
    the same placement rule `Optimizer.load_state_dict` applies."""
    for group_index, group in enumerate(optimizer.param_groups):
        step_on_host = not (group.get("fused") or group.get("capturable"))
        for param_index, param in enumerate(group["params"]):
            state = optimizer.state.get(param, {})  # .get: never create state for an unstepped parameter
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and not (key == "step" and step_on_host):
                    yield ("optimizer", group_index, param_index, key), state, key


def move_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    host: PinnedHostCopies,
) -> int:
    """Move parameters, buffers, gradients and optimizer state between the GPU and
    `host`'s pinned buffers; returns the bytes of the state now on `device`. Host to
    GPU reads the pinned buffers asynchronously (stream-ordered before any kernel that
    uses the result); GPU to host waits for its copies before returning, since host
    code reads them."""
    to_host = device.type == "cpu"
    placed = 0

    def move(slot: Hashable, tensor: torch.Tensor) -> torch.Tensor:
        nonlocal placed
        placed += tensor.numel() * tensor.element_size()
        if tensor.device == device:
            return tensor
        return host.to_host(slot, tensor) if to_host else tensor.to(device, non_blocking=True)

    for name, param in model.named_parameters():  # a tied weight is listed (and moved) once
        param.data = move(("param", name), param.data)
        if param.grad is not None:
            param.grad = param.grad.to(device)  # rare: a park drops gradients first
    for module_name, module in model.named_modules():
        # Assigning a registered buffer's name replaces the buffer and keeps whether it is persistent.
        for buffer_name, buffer in list(module.named_buffers(recurse=False, remove_duplicate=False)):
            setattr(module, buffer_name, move(("buffer", module_name, buffer_name), buffer))
    for slot, state, key in optimizer_state_slots(optimizer):
        state[key] = move(slot, state[key])
    if to_host and torch.cuda.is_available():
        torch.cuda.synchronize()
    return placed
