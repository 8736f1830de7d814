"""SCAN as prompts for a decoder-only LM (issue 38): one stream `command SEP actions EOS` per sample.

The cut-off protocol, the word vocabulary and the scoring are the SCAN example's
(`panm_hf.pipelines.scan_data`): train on the commands with at most L actions, a fixed 10% of
those held out as the i.i.d. set, test on every longer one. The prompt is the command's words and
`SEP`; the response is the actions and `EOS`. Labels are `-100` on the prompt and the padding, so
`causal_memory="prompt"` finds the prompt as what precedes the first supervised label. Evaluation
decodes greedily from the prompt until `EOS` and scores exact match with the EOS diagnosis.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerFast

from panm_hf.pipelines.scan_data import ScanSplit, word_tokenizer

SEP = "<sep>"


@dataclass
class ScanPrompts:
    """One SCAN set as right-padded LM streams `command SEP actions EOS`, and the set itself (for scoring)."""

    split: ScanSplit
    input_ids: torch.Tensor  # (examples, width)
    attention_mask: torch.Tensor  # (examples, width)
    labels: torch.Tensor  # (examples, width): the response's tokens, -100 on the prompt and the padding
    prompt_lengths: torch.Tensor  # (examples,): the command's words + SEP

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(input_ids, attention_mask, labels)` of `rows`, cut to their longest stream: `(rows, width)` each."""
        width = int(self.attention_mask[rows].sum(dim=1).max())
        return self.input_ids[rows, :width], self.attention_mask[rows, :width], self.labels[rows, :width]


def scan_tokenizer(train: ScanSplit) -> PreTrainedTokenizerFast:
    """The SCAN example's word vocabulary over the training range, plus `SEP`, the prompt's last token."""
    tokenizer = word_tokenizer(train.commands + train.actions)
    tokenizer.add_special_tokens({"sep_token": SEP})
    return tokenizer


def encode(split: ScanSplit, tokenizer: PreTrainedTokenizerFast) -> ScanPrompts:
    """`split` as streams `command SEP actions EOS`, right-padded, the loss on `actions EOS` only."""
    if tokenizer.sep_token_id is None:
        raise ValueError("The tokenizer has no sep_token; build it with scan_tokenizer(train).")
    commands = tokenizer(split.commands, add_special_tokens=False, padding=True, return_tensors="pt")
    responses = tokenizer(split.actions, padding=True, return_tensors="pt")  # the actions, then EOS
    command_lengths = commands["attention_mask"].sum(dim=1)  # (examples,)
    response_lengths = responses["attention_mask"].sum(dim=1)  # (examples,)
    size, command_width = commands["input_ids"].shape
    response_width = responses["input_ids"].shape[1]
    width = command_width + 1 + response_width
    steps = torch.arange(response_width).expand(size, -1)  # (examples, response_width)
    # a response token goes right after its row's SEP; padding goes to one extra column, dropped below
    response_at = torch.where(
        steps < response_lengths.unsqueeze(1), command_lengths.unsqueeze(1) + 1 + steps, width
    )  # (examples, response_width)
    input_ids = torch.full((size, width + 1), tokenizer.pad_token_id)  # (examples, width + 1)
    input_ids[:, :command_width] = commands["input_ids"]
    input_ids[torch.arange(size), command_lengths] = tokenizer.sep_token_id
    input_ids.scatter_(1, response_at, responses["input_ids"])
    labels = torch.full((size, width + 1), -100)  # (examples, width + 1)
    labels.scatter_(1, response_at, responses["input_ids"])
    real = command_lengths + 1 + response_lengths  # (examples,)
    attention_mask = (torch.arange(width) < real.unsqueeze(1)).long()  # (examples, width)
    return ScanPrompts(split, input_ids[:, :width], attention_mask, labels[:, :width], command_lengths + 1)


@torch.no_grad()
def greedy_responses(
    model, prompts: ScanPrompts, tokenizer: PreTrainedTokenizerFast, batch_size: int, max_new_tokens: int
) -> list[str]:
    """Greedy responses to every prompt (up to `EOS`), as space-separated action words in the set's order.

    Prompts are decoded in groups of equal length (SCAN's commands have 1-9 words), so none is padded.
    """
    was_training = model.training
    model.eval()
    order, texts = [], []
    for length in prompts.prompt_lengths.unique().tolist():
        rows = (prompts.prompt_lengths == length).nonzero().squeeze(1)  # (group,)
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            prompt = prompts.input_ids[chunk, :length]  # (chunk, length): command SEP
            out = model.generate(
                input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                do_sample=False, num_beams=1, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
            texts += tokenizer.batch_decode(out[:, length:], skip_special_tokens=True)
            order.append(chunk)
    model.train(was_training)
    position = torch.cat(order).argsort().tolist()  # the inverse permutation: set index -> decoded index
    return [" ".join(texts[index].split()) for index in position]


def scan_markdown(results: dict) -> str:
    """The per-model table: exact match on the longer outputs and the i.i.d. set, and the EOS diagnosis."""
    lines = [
        "| model | steps | params | test EM | i.i.d. EM | early | late | content |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in results["models"].items():
        eos = run["test"]["eos_diagnosis"]
        lines.append(
            f"| {name} | {run['steps']} | {run['parameters']:,} | {run['test']['exact_match']:.1f} | "
            f"{run['heldout']['exact_match']:.1f} | {eos['early']:.1f} | {eos['late']:.1f} | {eos['content']:.1f} |"
        )
    return (
        "\n".join(lines)
        + f"\n\nSCAN, cut-off L = {results['cutoff']}: greedy exact match % on the outputs longer than L (test) and"
        " on the i.i.d. set; early / late / content: % of test outputs that stopped early, ran late, or had the"
        " right length with wrong content.\n"
    )
