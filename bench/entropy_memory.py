"""Peak host memory of one micro-batch's loss forward and backward over the vocabulary,
with and without a differentiable entropy bonus (rl.entropy_coef, S-OPT-1).

    python -m bench.entropy_memory            # prints one line per variant

Each variant runs in a fresh process and reports the growth of its peak resident set
over the moment the logits exist: `none` is the log-prob gather alone, `ours` adds
`token_entropy` (keeps no second (b, r, V) tensor), `naive` adds −Σ exp(lp)·lp.
"""

from __future__ import annotations

import resource
import subprocess
import sys

ROWS, VOCABULARY = 2048, 32768  # (b·r, V): 256 MiB per float32 tensor of the vocabulary's size


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(variant: str) -> float:
    import torch

    from algorithm.ppo_math import token_entropy

    torch.manual_seed(0)
    logits = torch.randn(1, ROWS, VOCABULARY, requires_grad=True)
    tokens = torch.randint(0, VOCABULARY, (1, ROWS))
    logits.grad = torch.zeros_like(logits)  # the gradient's buffer exists in every variant
    start = _peak_mib()
    log_probs = logits.log_softmax(-1)
    loss = -torch.gather(log_probs, 2, tokens.unsqueeze(-1)).sum()
    if variant == "ours":
        loss = loss - 0.01 * token_entropy(log_probs).sum()
    elif variant == "naive":
        probs = log_probs.exp()
        loss = loss + 0.01 * (probs * log_probs.masked_fill(probs == 0, 0.0)).sum()
    loss.backward()
    return _peak_mib() - start


if __name__ == "__main__":
    if len(sys.argv) == 2:
        print(f"{measure(sys.argv[1]):.0f}")
    else:
        one = ROWS * VOCABULARY * 4 / 2**20
        for variant in ("none", "ours", "naive"):
            out = subprocess.run([sys.executable, "-m", "bench.entropy_memory", variant], capture_output=True,
                                 text=True, check=True).stdout.strip()
            print(f"{variant}: peak grows {out} MiB ({float(out) / one:.2f} x one (b, r, V) float32 tensor)")
