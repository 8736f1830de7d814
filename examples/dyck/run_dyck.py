#!/usr/bin/env python
"""Dyck-n next-symbol prediction: the paper's stack-RNN baseline vs the same stack-RNN + PANM (Sec. 3.2).

The task (Suzgun et al. 2019, which the paper follows; generator in `research/dyck.py`): read a
Dyck-n string one symbol at a time; after each symbol output the set of symbols that may come
next (multi-hot over the 2n brackets). A string is correct only if every output at every step is
right at threshold 0.5; accuracy is the percentage of correct strings. Train on lengths 2..L
(D2: L = 10, D3: L = 20), test on strings of length L+2, 2L, 4L and 8L (and L itself).

Models (autoregressive, teacher-forced: the input at step t is the string's t-th symbol, which is
the previous step's output `z_t = y_{t-1}` of the paper's appendix):

* ``srnn``: Suzgun et al.'s stack-RNN with a softmax push/pop gate (marnns `SRNN_Softmax`, its
  defaults: hidden 8, stack 104 x 5), vectorised over the batch; output `sigmoid(W_y h_t)`.
* ``panm``: the same stack-RNN as PANM's encoder. The causal memory `M` holds, for every symbol
  read so far, its one-hot token and the stack-RNN state (the paper's main text stores the raw
  tokens, its appendix uses the SRNN as the encoder: both are in the slot). `PanmMemory` decodes
  with `causal_positions` (step t reads slots <= t: "masking M"), `z_t` = the one-hot of symbol t,
  and the Controller's `g^o` gives the 2n logits (no decoder stacked on top). `--panm_output stack`
  adds the baseline's own `W_y h_t` to a zero-initialised `g^o` instead (starts as the baseline).

Training as in the paper's appendix: 5000 training strings, 5 epochs, the checkpoint with the best
training accuracy (scored at the end of each epoch) is tested. Adam at marnns' learning rate 0.01.

    python examples/dyck/run_dyck.py --num_pairs 2 --output_dir runs/dyck2
    python examples/dyck/run_dyck.py --num_pairs 3 --output_dir runs/dyck3
    python examples/dyck/run_dyck.py --smoke --output_dir /tmp/dyck_smoke   # seconds

Writes `results.json` and `results.md` (accuracy per test length, both models) to `--output_dir`.
"""

from __future__ import annotations

import copy
import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import HfArgumentParser

from panm_hf import PanmMemory, PanmMemoryConfig
from research.dyck import PAD, make_dyck_batch, sequence_accuracy

MODELS = ("srnn", "panm")
PANM_OUTPUTS = ("controller", "stack")
PAPER_TRAIN_LENGTH = {2: 10, 3: 20}  # the paper's L: "10 (D2) and 20 (D3) tokens"
# PANM sizes for a CPU run (the paper: 256-d GRUs, 128-d MLPs); b = 10 as in the paper.
DYCK_PANM_DEFAULTS = {"pointer_hidden_size": 32, "controller_hidden_size": 32, "mlp_hidden_size": 32}


@dataclass
class DyckArguments:
    """The task, the data sizes and the training budget."""

    num_pairs: int = field(default=2, metadata={"help": "n of Dyck-n: 2 (D2) or 3 (D3) in the paper."})
    train_length: int = field(default=0, metadata={"help": "L, the longest training string; 0: the paper's."})
    model: str = field(default="both", metadata={"help": "srnn, panm or both."})
    panm_output: str = field(
        default="controller",
        metadata={"help": "PANM's logits: controller (g^o alone, the paper) or stack (W_y h_t + zero-init g^o)."},
    )
    train_size: int = field(default=5000, metadata={"help": "Training strings (paper: 5000)."})
    test_size: int = field(default=1000, metadata={"help": "Test strings per test length (paper: 5000)."})
    epochs: int = field(default=5, metadata={"help": "Training epochs (paper: 5)."})
    batch_size: int = field(default=8, metadata={"help": "Training batch size (marnns: 1)."})
    learning_rate: float = field(default=0.01, metadata={"help": "Adam learning rate (marnns: 0.01)."})
    srnn_hidden_size: int = field(default=8, metadata={"help": "Stack-RNN hidden size (marnns: 8)."})
    stack_size: int = field(default=104, metadata={"help": "Stack slots (marnns: 104)."})
    stack_dim: int = field(default=5, metadata={"help": "Stack slot size (marnns: 5)."})
    eval_batch_size: int = field(default=250)
    seed: int = field(default=0)
    output_dir: str = field(default="runs/dyck")
    smoke: bool = field(default=False, metadata={"help": "Tiny data and models: a CI run in seconds."})


SMOKE = {"train_size": 64, "test_size": 16, "epochs": 2, "batch_size": 16}
SMOKE_PANM = {"pointer_hidden_size": 8, "controller_hidden_size": 8, "mlp_hidden_size": 8}


class StackRnn(nn.Module):
    """Suzgun et al.'s stack-RNN with a softmax push/pop gate (marnns `SRNN_Softmax`), batched.

    Per step: `h~ = W_sh s_{t-1}[0] + h_{t-1}`, `h_t = tanh(W_x x_t + W_h h~)`, action weights
    `a_t = softmax(W_a h_t)` (push, pop), pushed element `sigmoid(W_n h_t)`,
    `s_t = a_push * push(s_{t-1}) + a_pop * pop(s_{t-1})`.

    Args:
        vocab_size: 2n, the one-hot input size.
        hidden_size: RNN state size.
        stack_size, stack_dim: the stack's slots and slot size.
    """

    def __init__(self, vocab_size: int, hidden_size: int, stack_size: int, stack_dim: int):
        super().__init__()
        self.hidden_size, self.stack_size, self.stack_dim = hidden_size, stack_size, stack_dim
        self.cell = nn.RNNCell(vocab_size, hidden_size)
        self.stack_to_hidden = nn.Linear(stack_dim, hidden_size)  # W_sh
        self.action = nn.Linear(hidden_size, 2)  # W_a
        self.new_element = nn.Linear(hidden_size, stack_dim)  # W_n

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """`(batch, steps, vocab)` one-hot -> `(batch, steps, hidden)` states."""
        batch, steps, _ = inputs.shape
        hidden = inputs.new_zeros(batch, self.hidden_size)
        stack = inputs.new_zeros(batch, self.stack_size, self.stack_dim)
        states = []
        for t in range(steps):  # a recurrence over time (the batch is vectorised)
            hidden = self.cell(inputs[:, t], self.stack_to_hidden(stack[:, 0]) + hidden)
            action = torch.softmax(self.action(hidden), dim=-1)  # (batch, 2): push, pop
            element = torch.sigmoid(self.new_element(hidden)).unsqueeze(1)  # (batch, 1, stack_dim)
            pushed = torch.cat([element, stack[:, :-1]], dim=1)  # (batch, stack, dim)
            popped = torch.cat([stack[:, 1:], stack.new_zeros(batch, 1, self.stack_dim)], dim=1)
            stack = action[:, 0, None, None] * pushed + action[:, 1, None, None] * popped
            states.append(hidden)
        return torch.stack(states, dim=1)  # (batch, steps, hidden)


class SrnnModel(nn.Module):
    """The baseline: stack-RNN, logits `W_y h_t` (marnns applies the sigmoid; the loss does here)."""

    def __init__(self, vocab_size: int, args: DyckArguments):
        super().__init__()
        self.encoder = StackRnn(vocab_size, args.srnn_hidden_size, args.stack_size, args.stack_dim)
        self.output = nn.Linear(args.srnn_hidden_size, vocab_size)  # W_y

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs = one_hot(tokens, self.output.out_features)
        return self.output(self.encoder(inputs))  # (batch, steps, vocab)


class SrnnPanmModel(nn.Module):
    """The stack-RNN as PANM's encoder; PANM decodes autoregressively over the causal memory.

    `args.panm_output`: `"controller"` (the paper's appendix: the logits are the Controller's `g^o`
    alone) or `"stack"` (the baseline's own `W_y h_t` plus `g^o`, whose last layer starts at zero, so
    the model starts as the baseline: the library's `placement="stack"`).
    """

    def __init__(self, vocab_size: int, args: DyckArguments, panm_config: PanmMemoryConfig):
        super().__init__()
        self.vocab_size = vocab_size
        self.encoder = StackRnn(vocab_size, args.srnn_hidden_size, args.stack_size, args.stack_dim)
        self.panm = PanmMemory(
            panm_config,
            memory_dim=vocab_size + args.srnn_hidden_size,
            decoder_input_size=vocab_size,
            output_size=vocab_size,
        )
        self.output = None
        if args.panm_output == "stack":  # built only here: the default draws the same init as before
            self.output = nn.Linear(args.srnn_hidden_size, vocab_size)  # W_y, as in the baseline
            nn.init.zeros_(self.panm.controller.output_mlp[-1].weight)
            nn.init.zeros_(self.panm.controller.output_mlp[-1].bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs = one_hot(tokens, self.vocab_size)  # (batch, steps, vocab); z_t = the symbol just read
        states = self.encoder(inputs)  # (batch, steps, hidden)
        memory = torch.cat([inputs, states], dim=-1)  # (batch, steps, vocab + hidden)
        mask = tokens != PAD
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)  # (batch, steps)
        output = self.panm(memory, inputs, attention_mask=mask, causal_positions=positions)
        logits = output.hidden_states  # (batch, steps, vocab) from g^o
        return logits if self.output is None else self.output(states) + logits


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Token ids (PAD: all zero) -> `(batch, steps, vocab)` float one-hot."""
    return nn.functional.one_hot(tokens.clamp(min=0), vocab_size).float() * (tokens != PAD).unsqueeze(-1)


def build_model(name: str, vocab_size: int, args: DyckArguments, panm_config: PanmMemoryConfig) -> nn.Module:
    if name == "srnn":
        return SrnnModel(vocab_size, args)
    return SrnnPanmModel(vocab_size, args, panm_config)


def training_lengths(size: int, train_length: int, generator: torch.Generator) -> torch.Tensor:
    """Even lengths uniform over 2..L."""
    return 2 * torch.randint(1, train_length // 2 + 1, (size,), generator=generator)


@torch.no_grad()
def evaluate(model: nn.Module, batch, batch_size: int) -> dict:
    """Sequence accuracy (%, the paper's metric) and step accuracy (% of steps with every output right)."""
    model.eval()
    correct, step_right, steps = 0, 0, 0
    for start in range(0, batch.tokens.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        width = int(batch.lengths[rows].max())
        tokens, targets, mask = batch.tokens[rows, :width], batch.targets[rows, :width], batch.mask[rows, :width]
        logits = model(tokens)
        correct += int(sequence_accuracy(logits, targets, mask).sum())
        right = ((logits >= 0) == (targets >= 0.5)).all(dim=-1) & mask  # (batch, steps)
        step_right += int(right.sum())
        steps += int(mask.sum())
    model.train()
    return {"sequence_accuracy": 100.0 * correct / batch.tokens.shape[0], "step_accuracy": 100.0 * step_right / steps}


def train_one(name: str, args: DyckArguments, panm_config: PanmMemoryConfig, train_batch, test_batches) -> dict:
    """Train for `epochs`, keep the epoch with the best training accuracy, test it at every length."""
    vocab_size = 2 * args.num_pairs
    torch.manual_seed(args.seed)  # both models start from the same stream and see the same batches
    model = build_model(name, vocab_size, args, panm_config)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
    order_generator = torch.Generator().manual_seed(args.seed + 1)
    best, best_state, history = -1.0, None, []
    start = time.time()
    for epoch in range(args.epochs):
        order = torch.randperm(args.train_size, generator=order_generator)
        total = 0.0
        for first in range(0, args.train_size, args.batch_size):
            rows = order[first : first + args.batch_size]
            width = int(train_batch.lengths[rows].max())
            tokens, targets, mask = (
                train_batch.tokens[rows, :width], train_batch.targets[rows, :width], train_batch.mask[rows, :width]
            )
            logits = model(tokens)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="none")
            loss = (loss.mean(dim=-1) * mask).sum() / mask.sum()  # mean over real steps
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(rows)
        train_scores = evaluate(model, train_batch, args.eval_batch_size)
        history.append({"epoch": epoch + 1, "loss": total / args.train_size, **train_scores})
        print(f"{name} epoch {epoch + 1}: loss {total / args.train_size:.4f}, "
              f"train accuracy {train_scores['sequence_accuracy']:.1f}%", flush=True)  # fmt: skip
        if train_scores["sequence_accuracy"] > best:
            best, best_state = train_scores["sequence_accuracy"], copy.deepcopy(model.state_dict())
    train_seconds = time.time() - start
    model.load_state_dict(best_state)
    return {
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(train_seconds, 1),
        "history": history,
        "best_epoch": 1 + max(range(len(history)), key=lambda i: (history[i]["sequence_accuracy"], -i)),
        "test": {str(length): evaluate(model, batch, args.eval_batch_size) for length, batch in test_batches.items()},
    }


def test_lengths(train_length: int) -> list[int]:
    """L, then the paper's L+2, 2L, 4L, 8L."""
    return [train_length, train_length + 2, 2 * train_length, 4 * train_length, 8 * train_length]


def markdown(summary: dict) -> str:
    lengths = summary["test_lengths"]
    lines = [
        f"Dyck-{summary['num_pairs']}, train lengths 2..{summary['train_length']}, "
        f"{summary['train_size']} training strings, {summary['epochs']} epochs, seed {summary['seed']}. "
        "Sequence accuracy % (step accuracy % in brackets).",
        "",
        "| model | params | train s | " + " | ".join(f"n={n}" for n in lengths) + " |",
        "|---|---|---|" + "---|" * len(lengths),
    ]
    for name, result in summary["results"].items():
        cells = [f"{result['test'][str(n)]['sequence_accuracy']:.1f} ({result['test'][str(n)]['step_accuracy']:.1f})"
                 for n in lengths]  # fmt: skip
        head = f"| {name} | {result['num_parameters']:,} | {result['train_seconds']} | "
        lines.append(head + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser((DyckArguments, PanmMemoryConfig))
    parser.set_defaults(**DYCK_PANM_DEFAULTS)
    args, panm_config = parser.parse_args_into_dataclasses(args=argv)
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
        for name, value in SMOKE_PANM.items():
            setattr(panm_config, name, value)
    if args.num_pairs not in (1, 2, 3, 4):
        raise ValueError(f"--num_pairs must be 1..4 (got {args.num_pairs}); the paper runs 2 and 3.")
    if args.model not in (*MODELS, "both"):
        raise ValueError(f"--model must be one of {(*MODELS, 'both')} (got {args.model!r}).")
    if args.panm_output not in PANM_OUTPUTS:
        raise ValueError(f"--panm_output must be one of {PANM_OUTPUTS} (got {args.panm_output!r}).")
    train_length = args.train_length or PAPER_TRAIN_LENGTH.get(args.num_pairs, 10)
    if train_length < 2 or train_length % 2:
        raise ValueError(f"--train_length must be an even number >= 2 (got {train_length}).")
    lengths = test_lengths(train_length)
    if args.smoke:
        lengths = lengths[:3]
    if lengths[-1] > 2**panm_config.address_bits:
        bits = (lengths[-1] - 1).bit_length()
        raise ValueError(f"the longest test string ({lengths[-1]}) needs --address_bits >= {bits}.")
    if lengths[-1] // 2 > args.stack_size:
        raise ValueError(f"--stack_size {args.stack_size} is shallower than a {lengths[-1]}-symbol string can nest.")
    panm_config.validate()

    generator = torch.Generator().manual_seed(args.seed)
    train_batch = make_dyck_batch(training_lengths(args.train_size, train_length, generator), args.num_pairs,
                                  generator=generator)  # fmt: skip
    test_generator = torch.Generator().manual_seed(10_000 + args.seed)  # never the training stream
    test_batches = {n: make_dyck_batch(torch.full((args.test_size,), n), args.num_pairs, generator=test_generator)
                    for n in lengths}  # fmt: skip

    names = MODELS if args.model == "both" else (args.model,)
    results = {name: train_one(name, args, panm_config, train_batch, test_batches) for name in names}
    summary = {
        "num_pairs": args.num_pairs,
        "train_length": train_length,
        "test_lengths": lengths,
        **{k: getattr(args, k) for k in ("train_size", "test_size", "epochs", "batch_size", "learning_rate", "seed")},
        "args": asdict(args),
        "panm_config": asdict(panm_config),
        "machine": f"{platform.machine()} CPU, torch threads {torch.get_num_threads()}",
        "results": results,
    }
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "results.json").write_text(json.dumps(summary, indent=2))
    table = markdown(summary)
    (output_dir / "results.md").write_text(table)
    print(table)
    return summary


if __name__ == "__main__":
    main()
