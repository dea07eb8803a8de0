"""Packing a micro-batch's rows into one row without padding (S-PATH-3).

Where the attention kernel takes packed rows, a micro-batch of m padded rows runs as
one row of T real tokens whose positions restart at 0 for each original row, and no
attention mask: transformers (5.x, `masking_utils.find_packed_sequence_indices`) reads
the restarts as sequence boundaries, so no token attends across rows. flash-attention's
varlen kernel then computes each row alone; SDPA and eager build a block-diagonal mask
over all T tokens instead (docs/performance.md, "Padding", says what that costs here).

Notation: m = rows, p + r = their padded prompt and response columns, T = real tokens.
Prompts are left-padded and responses right-padded, so each row's real tokens are one
contiguous run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")


def takes_packed_rows(attention: str | None) -> bool:
    """Whether the attention implementation a model was given (`model.attention`)
    computes packed rows without the cost of a dense mask over all of them:
    flash-attention's varlen kernels. None (transformers' default, SDPA) does not."""
    return attention in VARLEN_ATTENTION


@dataclass(frozen=True)
class PackedRows:
    input_ids: torch.Tensor     # (1, T)
    position_ids: torch.Tensor  # (1, T) restarting at 0 for each row
    predicting: torch.Tensor    # (m, r) index into T of the output that predicts each response column
    present: torch.Tensor       # (m, r) bool: the response column is a real token

    def response(self, per_position: torch.Tensor) -> torch.Tensor:
        """An output (1, T, ...) -> (m, r, ...), zero on the padding columns (which callers
        mask, as they mask a padded forward's)."""
        gathered = per_position[0][self.predicting]
        shape = self.present.shape + (1,) * (gathered.dim() - 2)
        return gathered * self.present.reshape(shape).to(gathered.dtype)


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int) -> PackedRows:
    """(m, p + r) padded rows -> one packed row and the way back to (m, r)."""
    real = attention_mask.bool()
    lengths = real.sum(dim=1)  # (m,)
    prompt_lengths = real[:, :prompt_length].sum(dim=1)  # (m,)
    response_lengths = real[:, prompt_length:].sum(dim=1)  # (m,)
    offsets = torch.cumsum(lengths, dim=0) - lengths  # (m,) where each row starts in T
    positions = torch.arange(int(lengths.max()) if len(lengths) else 0, device=input_ids.device)
    position_ids = torch.cat([positions[: int(n)] for n in lengths])
    columns = torch.arange(input_ids.shape[1] - prompt_length, device=input_ids.device)  # (r,)
    # The output at a row's position k predicts its token k + 1: response column j is
    # predicted from the row's token P + j - 1 (its prompt's last token for j = 0).
    predicting = offsets[:, None] + (prompt_lengths[:, None] - 1).clamp(min=0) + columns[None, :]
    present = columns[None, :] < response_lengths[:, None]
    return PackedRows(
        input_ids=input_ids[real].unsqueeze(0),
        position_ids=position_ids.unsqueeze(0),
        predicting=torch.where(present, predicting, torch.zeros_like(predicting)),
        present=present,
    )
