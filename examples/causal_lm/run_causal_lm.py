"""Length generalisation of a decoder-only LM, with and without PANM (issues 16 and 38).

An algorithmic task of the suite (`research/algorithmic.py`) framed as language modelling:
each sample is one token sequence ``BOS x_1 .. x_l SEP y_1 .. y_l`` (Copy: ``y = x``; Reverse:
``y`` reversed), the loss is on the ``y`` part only (``-100`` elsewhere), so the prompt is
``BOS x SEP``. A small GPT-2 (learned position embeddings) or Llama (rotary) built from its
config is trained on ``l`` in ``1..L`` for the same number of steps per model (``--max_steps``;
``--time_budget`` adds an optional wall-clock cap), then prompted with ``BOS x SEP`` and decoded
greedily (with the cache) for ``l`` tokens at longer test lengths. Models: the backbone alone
(``backbone``), the same backbone wrapped by `PanmForCausalLM` with the paper's Pointer Unit
(``panm``) and with content-free pointer arithmetic (``panm_shift``, `pointer_update="shift"`, its
pointers starting by walking the prompt: ``--shift_init walk``, the default here; ``uniform`` is the library's).
``--causal_memory`` picks PANM's memory: every token so far (``sequence``) or the prompt
(``prompt``, the seq2seq framing: the pointers start at ``BOS`` and ``SEP``).

``--task scan`` frames SCAN the same way (``scan_prompts.py``): one stream ``command SEP actions
EOS``, the loss on ``actions EOS``, on the SCAN example's length cut-off protocol (``--cutoff`` L:
train on at most L actions, a fixed 10% of those held out as the i.i.d. set, test on every longer
output), scored by greedy exact match with the EOS diagnosis.

    python examples/causal_lm/run_causal_lm.py --causal_memory prompt            # Copy, 3 models, 3,000 steps
    python examples/causal_lm/run_causal_lm.py --causal_memory prompt --task reverse --backbone llama
    python examples/causal_lm/run_causal_lm.py --causal_memory prompt --task scan --cutoff 26
    python examples/causal_lm/run_causal_lm.py --smoke --output_dir /tmp/causal_smoke

Writes ``results.json`` (the command, the arguments and the machine; per model: steps, time, loss,
and token and sequence accuracy per test length with pointer hits, or for SCAN exact match and the
EOS diagnosis on the test and i.i.d. sets) and ``results.md`` (the table) into ``--output_dir``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from scan_prompts import encode, greedy_responses, scan_markdown, scan_tokenizer
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from panm_hf import PanmForCausalLM
from panm_hf.configuration_panm import CAUSAL_MEMORIES, EOS_DECISIONS
from panm_hf.memory_config import SHIFT_INITS
from panm_hf.pipelines.scan_data import load_cutoff_split, score
from research.algorithmic import NUM_TOKENS, make_batch

SEP, BOS, PAD = NUM_TOKENS, NUM_TOKENS + 1, NUM_TOKENS + 2  # tokens 0..9 are the task's symbols
VOCAB = NUM_TOKENS + 3
ALGORITHMIC_IDS = dict(vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=PAD, pad_token_id=PAD)  # never stops early
MODELS = {"backbone": None, "panm": "attention", "panm_shift": "shift"}
TASKS = ("copy", "reverse", "scan")
SIZES = {
    "full": dict(gpt2=dict(n_embd=128, n_layer=2, n_head=4, n_positions=256),
                 llama=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                            max_position_embeddings=256),
                 panm={}),
    "smoke": dict(gpt2=dict(n_embd=16, n_layer=1, n_head=2, n_positions=64),
                  llama=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                             max_position_embeddings=64),
                  panm=dict(pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8)),
}  # fmt: skip


def lm_batch(task: str, batch_size: int, length: int | tuple[int, int], generator: torch.Generator):
    """`(input_ids, attention_mask, labels)` of `BOS x SEP y`, right-padded; labels only on `y`.

    Shapes `(batch, 2 * hi + 2)` where `hi` is the longest length.
    """
    batch = make_batch(task, batch_size, length, generator=generator)
    tokens, targets = batch.input_tokens, batch.labels  # (batch, hi), -100 padded
    size, hi = tokens.shape
    lengths = (tokens >= 0).sum(dim=1)  # (batch,)
    width = 2 * hi + 2
    steps = torch.arange(hi).expand(size, -1)  # (batch, hi)
    valid = steps < lengths.unsqueeze(1)  # (batch, hi)
    overflow = width  # invalid entries are written to one extra column, dropped below
    x_at = torch.where(valid, 1 + steps, overflow)  # (batch, hi)
    y_at = torch.where(valid, lengths.unsqueeze(1) + 2 + steps, overflow)  # (batch, hi)
    rows = torch.arange(size)
    input_ids = torch.full((size, width + 1), PAD)  # (batch, width + 1)
    input_ids[:, 0] = BOS
    input_ids.scatter_(1, x_at, tokens.clamp(min=0))
    input_ids[rows, lengths + 1] = SEP
    input_ids.scatter_(1, y_at, targets.clamp(min=0))
    labels = torch.full((size, width + 1), -100)  # (batch, width + 1)
    labels.scatter_(1, y_at, targets.clamp(min=0))
    attention_mask = (torch.arange(width + 1) < (2 * lengths + 2).unsqueeze(1)).long()  # (batch, width + 1)
    return input_ids[:, :width], attention_mask[:, :width], labels[:, :width]


def build(
    name: str,
    size: str,
    seed: int,
    address_bits: int,
    backbone_type: str = "gpt2",
    causal_memory: str = "sequence",
    ids: dict | None = None,
    shift_init: str = "walk",
    eos_decision: str = "shared",
    sliding_window: int = 24,
):
    """The backbone (GPT-2: learned absolute positions; Llama: rotary positions; Mistral: Llama's with its
    self-attention limited to the last `sliding_window` tokens), alone or wrapped with PANM
    whose memory is `causal_memory` (every token so far, or the prompt); `ids`: the vocabulary size and the
    special token ids (default: the algorithmic tasks'); `shift_init`: the `panm_shift` model's starting moves;
    `eos_decision`: who decides EOS in the PANM models."""
    torch.manual_seed(seed)
    ids = ALGORITHMIC_IDS if ids is None else ids
    if backbone_type == "llama":
        backbone = LlamaForCausalLM(LlamaConfig(**ids, **SIZES[size]["llama"]))
    elif backbone_type == "mistral":  # Llama's sizes; every head its own key and value, as in Llama
        sizes = SIZES[size]["llama"]
        config = MistralConfig(**ids, **sizes, num_key_value_heads=sizes["num_attention_heads"],
                               sliding_window=sliding_window)  # fmt: skip
        backbone = MistralForCausalLM(config)
    else:
        config = GPT2Config(**ids, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **SIZES[size]["gpt2"])
        backbone = GPT2LMHeadModel(config)
    if MODELS[name] is None:
        return backbone
    return PanmForCausalLM.from_backbone(
        backbone,
        pointer_update=MODELS[name],
        address_bits=address_bits,
        causal_memory=causal_memory,
        shift_init=shift_init if MODELS[name] == "shift" else "uniform",
        eos_decision=eos_decision,
        **SIZES[size]["panm"],
    )


@torch.no_grad()
def pointer_hits(model, task: str, input_ids: torch.Tensor, labels: torch.Tensor, length: int) -> dict:
    """Diagnosis: how often each PANM read's argmax is the slot holding the token to output.

    Teacher-forced; step `t = L + 1 + j` predicts `y_j`, whose source is slot `1 + j` (Copy) or
    `L - j` (Reverse); the slots are the tokens from `BOS` on with either memory (the prompt
    `BOS x SEP` comes first, found from the labels). Keys: `unit0` (base pointer), `unit1` (end
    pointer), `mode2`.
    """
    out = model(input_ids=input_ids, labels=labels, output_attentions=True)
    steps = torch.arange(length + 1, 2 * length + 1)  # (L,) the steps that predict y
    j = steps - length - 1
    source = 1 + j if task == "copy" else length - j  # (L,)
    reads = {f"unit{u}": out.address_attentions[:, steps, u] for u in range(out.address_attentions.shape[2])}
    if out.mode2_attentions is not None:
        reads["mode2"] = out.mode2_attentions[:, steps, 0]
    return {name: float((weights.argmax(-1) == source).float().mean()) for name, weights in reads.items()}


@torch.no_grad()
def evaluate(model, task: str, length: int, samples: int, batch_size: int, seed: int) -> tuple[float, float]:
    """Greedy decoding of `y` from the prompt `BOS x SEP`: (token accuracy, sequence accuracy, pointer hits)."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    correct = exact = 0
    hits = []
    for start in range(0, samples, batch_size):
        input_ids, _, labels = lm_batch(task, min(batch_size, samples - start), length, generator)
        if isinstance(model, PanmForCausalLM):
            hits.append(pointer_hits(model, task, input_ids, labels, length))
        prompt = input_ids[:, : length + 2]  # (batch, L + 2): BOS x SEP
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=length,
                             min_new_tokens=length, do_sample=False, num_beams=1, pad_token_id=PAD)  # fmt: skip
        predicted = out[:, length + 2 :]  # (batch, L)
        target = labels[:, length + 2 :]  # (batch, L)
        correct += int((predicted == target).sum())
        exact += int((predicted == target).all(dim=1).sum())
    mean_hits = {name: sum(h[name] for h in hits) / len(hits) for name in hits[0]} if hits else None
    return correct / (samples * length), exact / samples, mean_hits


def train(model, args, generator: torch.Generator, sample=None) -> dict:
    """`args.max_steps` AdamW steps on batches `sample(generator)` (default: the algorithmic task's, lengths 1..L)."""
    if sample is None:

        def sample(generator):
            return lm_batch(args.task, args.batch_size, (1, args.train_length), generator)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model.train()
    started, steps, losses = time.perf_counter(), 0, []
    budget = args.time_budget if args.time_budget is not None else float("inf")
    while steps < args.max_steps and time.perf_counter() - started < budget:
        input_ids, attention_mask, labels = sample(generator)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps += 1
        losses.append(float(loss.detach()))
        if steps % args.log_every == 0:
            print(f"  step {steps}  loss {sum(losses[-args.log_every:]) / args.log_every:.4f}  "
                  f"{time.perf_counter() - started:.0f}s", flush=True)  # fmt: skip
    tail = losses[-min(len(losses), 20) :]
    return {"steps": steps, "train_seconds": round(time.perf_counter() - started, 1),
            "final_loss": sum(tail) / max(len(tail), 1)}  # fmt: skip


def markdown(results: dict) -> str:
    lengths = results["test_lengths"]
    head = "| model | steps | params | " + " | ".join(f"L={n}" for n in lengths) + " |"
    lines = [head, "|" + "---|" * (3 + len(lengths))]
    for name, run in results["models"].items():
        cells = " | ".join(f"{100 * run['token_accuracy'][str(n)]:.1f} ({100 * run['sequence_accuracy'][str(n)]:.0f})"
                           for n in lengths)  # fmt: skip
        lines.append(f"| {name} | {run['steps']} | {run['parameters']:,} | {cells} |")
    return "\n".join(lines) + "\n\nToken accuracy % (exact-sequence accuracy % in brackets), greedy decoding.\n"


def algorithmic_runs(args, size: str) -> dict:
    """Copy or Reverse: each model trained on lengths 1..L, token and sequence accuracy per test length."""
    lengths = args.test_lengths or [args.train_length, args.train_length + 1, 2 * (args.train_length + 1),
                                    4 * (args.train_length + 1)]  # fmt: skip
    samples = 200 if args.eval_samples is None else args.eval_samples
    results = {"train_length": args.train_length, "test_lengths": lengths, "models": {}}
    for name in args.models:
        print(f"== {name}", flush=True)
        model = build(name, size, args.seed, args.address_bits, args.backbone, args.causal_memory,
                      shift_init=args.shift_init, eos_decision=args.eos_decision, sliding_window=args.sliding_window)
        run = train(model, args, torch.Generator().manual_seed(args.seed))
        run["parameters"] = sum(p.numel() for p in model.parameters())
        run["token_accuracy"], run["sequence_accuracy"], run["pointer_hits"] = {}, {}, {}
        for length in lengths:
            token, sequence, hits = evaluate(model, args.task, length, samples, args.eval_batch_size,
                                             seed=1000 + length)  # fmt: skip
            run["token_accuracy"][str(length)], run["sequence_accuracy"][str(length)] = token, sequence
            run["pointer_hits"][str(length)] = hits
            hits_text = "  reads on the source slot: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in hits.items()) \
                if hits else ""
            print(f"  L={length}: token {100 * token:.1f}%  sequence {100 * sequence:.1f}%{hits_text}", flush=True)
        results["models"][name] = run
    return results


def scan_runs(args, size: str) -> dict:
    """SCAN at `--cutoff`: each model trained on the training range, scored on the longer outputs and the i.i.d. set."""
    train_split, heldout, test = load_cutoff_split(args.data_dir, args.cutoff)
    tokenizer = scan_tokenizer(train_split)  # every word of the training range, whatever subset trains
    data = encode(train_split.subset(args.max_train_samples, args.seed), tokenizer)
    sets = {"test": encode(test.subset(args.eval_samples, args.seed), tokenizer),
            "heldout": encode(heldout.subset(args.eval_samples, args.seed), tokenizer)}  # fmt: skip
    ids = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    results = {"cutoff": args.cutoff, "data_dir": str(args.data_dir), "num_train": len(data),
               "num_eval": {key: len(prompts) for key, prompts in sets.items()}, "models": {}}  # fmt: skip

    def sample(generator):  # a fresh batch of training streams each step, drawn with replacement
        return data.batch(torch.randint(len(data), (args.batch_size,), generator=generator))

    for name in args.models:
        print(f"== {name}", flush=True)
        model = build(name, size, args.seed, args.address_bits, args.backbone, args.causal_memory, ids, args.shift_init,
                      args.eos_decision, args.sliding_window)
        run = train(model, args, torch.Generator().manual_seed(args.seed), sample)
        run["parameters"] = sum(p.numel() for p in model.parameters())
        started = time.perf_counter()
        for key, prompts in sets.items():
            predictions = greedy_responses(model, prompts, tokenizer, args.eval_batch_size, args.max_new_tokens)
            run[key] = score(predictions, prompts.split)
            run[key]["examples"] = [
                {"command": c, "target": a, "prediction": p}
                for c, a, p in zip(prompts.split.commands, prompts.split.actions, predictions)
                if p != a
            ][:5]
            eos = ", ".join(f"{k} {v:.1f}%" for k, v in run[key]["eos_diagnosis"].items())
            print(f"  {key}: exact match {run[key]['exact_match']:.1f}% ({eos})", flush=True)
        run["generate_seconds"] = round(time.perf_counter() - started, 1)
        results["models"][name] = run
    return results


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="copy", choices=list(TASKS))
    parser.add_argument("--causal_memory", "--causal-memory", default="sequence", choices=list(CAUSAL_MEMORIES),
                        help="PANM's memory: every token so far (sequence) or the prompt, BOS x SEP or SCAN's "
                             "command SEP (prompt)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--shift_init", "--shift-init", default="walk", choices=list(SHIFT_INITS),
                        help="panm_shift's starting moves: walk (base pointer +1, end pointer -1; measured best, "
                             "docs/results/causal_lm.md) or uniform (the library's default)")
    parser.add_argument("--eos_decision", "--eos-decision", default="shared", choices=list(EOS_DECISIONS),
                        help="the PANM models' EOS logit: from what the LM head reads (shared) or PANM alone (panm)")
    parser.add_argument("--backbone", default="gpt2", choices=["gpt2", "llama", "mistral"],
                        help="gpt2: learned absolute positions (the issue's example); llama: rotary positions; "
                        "mistral: rotary positions and a sliding window (--sliding_window)")
    parser.add_argument("--sliding_window", "--sliding-window", type=int, default=24,
                        help="mistral: how many tokens each self-attention query sees (itself included)")
    parser.add_argument("--train-length", type=int, default=9, help="L: training lengths are 1..L")
    parser.add_argument("--test-lengths", type=int, nargs="+", default=None, help="default L, L+1, 2(L+1), 4(L+1)")
    parser.add_argument("--data_dir", "--data-dir", default="../shared/data/scan",
                        help="--task scan: the folder with SCAN's tasks.txt.gz")
    parser.add_argument("--cutoff", type=int, default=26,
                        help="--task scan: train on outputs of at most L actions, test on longer (issue 38: 26, 30)")
    parser.add_argument("--max_train_samples", "--max-train-samples", type=int, default=None,
                        help="--task scan: a random subset of the training range (default: all of it)")
    parser.add_argument("--max_new_tokens", "--max-new-tokens", type=int, default=64,
                        help="--task scan: greedy decoding limit (SCAN's longest output: 48 actions + EOS)")
    parser.add_argument("--max_steps", "--max-steps", type=int, default=3000,
                        help="training steps, the same for every model")
    parser.add_argument("--time_budget", "--time-budget", type=float, default=None,
                        help="optional cap on training seconds per model (off by default: equal steps, not time)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--address-bits", type=int, default=10)
    parser.add_argument("--eval-samples", type=int, default=None,
                        help="samples per test length (copy, reverse: 200) or per SCAN set (all of it)")
    parser.add_argument("--eval-batch-size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--output_dir", "--output-dir", default="outputs/causal_lm")
    parser.add_argument("--smoke", action="store_true", help="tiny models, a few steps, a few test samples")
    args = parser.parse_args(argv)
    positive = ("max_new_tokens", "eval_batch_size", "batch_size", "eval_samples", "max_train_samples",
                "sliding_window")
    for flag in positive:
        value = getattr(args, flag)
        if value is not None and value < 1:
            optional = " (or left out for the default)" if flag in ("eval_samples", "max_train_samples") else ""
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1{optional}; got {value}.")
    if args.smoke:
        args.train_length, args.max_steps, args.eval_samples, args.log_every = 3, 3, 4, 1
        args.max_train_samples = min(args.max_train_samples or 256, 256)
        args.test_lengths = args.test_lengths or [3, 5]
        args.max_new_tokens = min(args.max_new_tokens, 50)  # the smoke GPT-2 has 64 positions; prompts <= 10
    return args


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_arguments(argv)
    torch.set_num_threads(args.threads)
    size = "smoke" if args.smoke else "full"
    machine = f"{platform.machine()} {platform.processor() or ''}, torch threads {args.threads}"
    results = {"task": args.task, "backbone": args.backbone, "causal_memory": args.causal_memory,
               "command": " ".join(["python", "examples/causal_lm/run_causal_lm.py", *argv]), "args": vars(args),
               "machine": machine}  # fmt: skip
    if args.task == "scan":
        results.update(scan_runs(args, size))
        table = scan_markdown(results)
    else:
        results.update(algorithmic_runs(args, size))
        table = markdown(results)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps(results, indent=2))
    (output / "results.md").write_text(table)
    print(table)
    return results


if __name__ == "__main__":
    main()
