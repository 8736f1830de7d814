"""Mix under the Chat-GPT table's reading, the suite's generator before issue 15 (a diagnostic).

Odd t: `y_t = x_ceil(L/2)` (as the paper's text); even t: `y_t = x_t` (the table's "true output"
`$%$&$%$@$#`), where `research.mix_targets` follows the text (even t: `x_1`). Takes `run.py`'s
flags; docs/RESULTS.md ("Why Mix fails at L+1") compares the two readings step by step:

    python examples/length_generalization/mix_table_rule.py --task mix --models panm panm_shift content \
        --seeds 0 --steps 400 --batch-size 32 --threads 1 --output-dir docs/results/mix_table_rule
"""

from __future__ import annotations

import run  # run.py beside this script
import torch

import research.algorithmic as algorithmic


def table_rule_targets(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Odd t (1-based): `x_ceil(L/2)`; even t: `x_t`. `x = 3 1 4 1 5` -> `y = 4 1 4 1 4`."""
    steps = torch.arange(tokens.shape[1], device=tokens.device)  # (max_len,)
    middle = ((lengths + 1) // 2 - 1).unsqueeze(1)  # (batch, 1), 0-based ceil(L/2)
    index = torch.where((steps % 2 == 0).unsqueeze(0), middle, steps.unsqueeze(0))  # (batch, max_len)
    return algorithmic._gather_tokens(tokens, lengths, index)


def main(argv=None) -> dict:
    algorithmic.mix_targets = table_rule_targets  # make_batch looks the rule up at call time
    return run.main(argv)


if __name__ == "__main__":
    main()
