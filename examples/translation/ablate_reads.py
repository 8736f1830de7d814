#!/usr/bin/env python
"""How much a trained PANM translation model relies on PANM, and where it gains or loses.

Loads runs of `run_translation.py` (their `results.json` and saved models), rebuilds the same
test split, and reports teacher-forced test perplexity per source-length bucket and per
target-position bucket (where in the output the tokens are: positions beyond the longest
training target are the length-extrapolation part of the test set) for:
the Transformer, PANM as trained, and PANM with the Controller's output removed
(`hidden_states` set to zero: for `placement="stack"` that is exactly the backbone path,
for `"residual"` it is `LayerNorm(z_t)`), and, with `content_read="decoder"`, PANM with its
pointer-based reads (Mode 1 and Mode 2) zeroed but the content read kept. A model whose
perplexity does not rise without a part has learned to ignore it. With `--panm_memory_slots K ...`,
also PANM with its memory cut to the first K real slots of each source (the backbone's
cross-attention keeps them all): whether PANM's gain or loss at a position comes from the slots
beyond the training lengths.

    python examples/translation/ablate_reads.py --run_dir runs/mt --data_dir ../shared/data/multi30k
    python examples/translation/ablate_reads.py --run_dir runs/mt_transformer runs/mt_panm --data_dir ... \
        --output ablation.json
    python examples/translation/ablate_reads.py --run_dir runs/mt --data_dir ... --panm_memory_slots 16 24

Several run directories must share one test split (same split ratio, test-sample count and seed);
a model name that repeats across them is suffixed with `@<directory name>`.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch
from length_split import length_split, load_local_pairs, sample
from run_translation import DataArguments, tokenize
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq

import panm_hf  # noqa: F401  (registers PanmForSeq2SeqLM with the Auto classes)
from panm_hf.pipelines.controls import apply_control, zero_reads

BUCKETS = ((0, 15), (15, 20), (20, 25), (25, 1000))  # source words, half-open
POSITION_BUCKETS = ((0, 8), (8, 16), (16, 24), (24, 32), (32, 1000))  # target token positions, half-open
SPLIT_FIELDS = ("split_ratio", "max_test_samples", "max_pool_samples", "source_lang", "target_lang")


def test_pairs(summary: dict, data_dir: str):
    """The test split `run_translation.py` evaluated, rebuilt from its recorded arguments."""
    data_args = summary["data_args"]
    seed = summary.get("seed", 42)
    pairs = load_local_pairs(data_dir, data_args["source_lang"], data_args["target_lang"])
    pairs = sample(pairs, data_args["max_pool_samples"], seed)
    _, test = length_split(pairs, data_args["split_ratio"])
    return sample(test, data_args["max_test_samples"], seed)


@torch.no_grad()
def per_sample_nll(model, tokenizer, pairs, data_args, batch_size: int = 100) -> tuple[list[float], list[int], dict]:
    """Summed token negative log-likelihood and token count of every test pair (teacher forcing),
    and the same summed per target position (`{"nll": (positions,), "count": (positions,)}`)."""
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    dataset = tokenize(pairs, tokenizer, data_args)  # truncated exactly as the run's evaluation was
    totals, counts = [], []
    position_nll = torch.zeros(data_args.max_target_length + 1)
    position_count = torch.zeros(data_args.max_target_length + 1)
    for start in range(0, len(dataset), batch_size):
        batch = collator([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
        logits = model(**batch).logits  # (batch, tgt_len, vocab)
        nll = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), batch["labels"], ignore_index=-100, reduction="none"
        )  # (batch, tgt_len)
        real = batch["labels"] != -100  # (batch, tgt_len)
        totals += nll.sum(dim=1).tolist()
        counts += real.sum(dim=1).tolist()
        steps = nll.shape[1]
        position_nll[:steps] += (nll * real).sum(dim=0)
        position_count[:steps] += real.sum(dim=0)
    return totals, counts, {"nll": position_nll, "count": position_count}


def position_perplexity(positions: dict) -> dict:
    """Perplexity of the tokens at each target-position bucket."""
    table = {}
    for low, high in POSITION_BUCKETS:
        count = float(positions["count"][low:high].sum())
        if count:
            nll = float(positions["nll"][low:high].sum()) / count
            table[f"{low}-{high}"] = {"tokens": int(count), "perplexity": round(math.exp(nll), 2)}
    return table


def bucket_perplexity(pairs, totals, counts) -> dict:
    table = {}
    for low, high in BUCKETS:
        chosen = [i for i, source in enumerate(pairs.sources) if low <= len(source.split()) < high]
        if chosen:
            nll = sum(totals[i] for i in chosen) / sum(counts[i] for i in chosen)
            table[f"{low}-{high}"] = {"n": len(chosen), "perplexity": round(math.exp(nll), 2)}
    table["all"] = {"n": len(totals), "perplexity": round(math.exp(sum(totals) / sum(counts)), 2)}
    return table


def score(model, tokenizer, pairs, data_args) -> dict:
    """Both tables of one model: per source-length bucket and per target-position bucket."""
    totals, counts, positions = per_sample_nll(model, tokenizer, pairs, data_args)
    return {
        "source_words": bucket_perplexity(pairs, totals, counts),
        "target_positions": position_perplexity(positions),
    }


def ablations(name: str, model, tokenizer, pairs, data_args) -> dict:
    """The model as trained and, for a PANM model, without its Controller output or its pointer reads."""
    report = {name: score(model, tokenizer, pairs, data_args)}
    if hasattr(model, "panm"):
        # Remove the Controller's contribution: PanmMemory's output hidden states become zero.
        def zero_output(module, inputs, output):
            output.hidden_states = torch.zeros_like(output.hidden_states)
            return output

        handle = model.panm.register_forward_hook(zero_output)
        report[f"{name} without Controller output"] = score(model, tokenizer, pairs, data_args)
        handle.remove()
    if getattr(getattr(model, "panm", None), "content_reader", None) is not None:
        # Keep the decoder-queried content read, zero the pointer-based reads (Mode 1 and Mode 2).
        handle = zero_reads(model)
        report[f"{name} without pointer reads"] = score(model, tokenizer, pairs, data_args)
        handle.remove()
    return report


def cut_memory(name: str, model, tokenizer, pairs, data_args, slots: list[int]) -> dict:
    """A PANM model scored with PANM's memory cut to the first `k` real slots of each source, for each `k`.

    Only PANM's binding changes (its Pointer Units, Mode 2, content read and `h^c_0` see `k` slots);
    the encoder and the backbone's cross-attention still see the whole source.
    """
    panm, report = model.panm, {}
    for k in slots:

        def bind(memory_states, attention_mask=None, k=k, **kwargs):
            if attention_mask is None:
                attention_mask = torch.ones(memory_states.shape[:2], dtype=torch.long, device=memory_states.device)
            rank = (attention_mask != 0).long().cumsum(dim=-1)  # (batch, slots): 1-based rank of each real slot
            kept = torch.where(rank <= k, attention_mask, torch.zeros_like(attention_mask))
            return type(panm).bind(panm, memory_states, kept, **kwargs)

        panm.bind = bind  # the instance attribute shadows the method for this score only
        try:
            report[f"{name} with PANM memory cut to {k} slots"] = score(model, tokenizer, pairs, data_args)
        finally:
            del panm.bind
    return report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run_dir", required=True, nargs="+", help="--output_dir of run_translation.py runs")
    parser.add_argument("--data_dir", required=True, help="Multi30K folder the runs used")
    parser.add_argument("--output", default=None, help="Also write the tables to this JSON file")
    parser.add_argument(
        "--panm_memory_slots", type=int, nargs="*", default=[],
        help="Also score each PANM model with PANM's memory cut to the first K real source slots (cross-attention "
        "keeps all)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if any(k < 1 for k in args.panm_memory_slots):
        raise ValueError(f"--panm_memory_slots must be >= 1 (got {args.panm_memory_slots}); PANM needs a real slot.")
    summaries = []
    for run_dir in args.run_dir:
        with open(os.path.join(run_dir, "results.json")) as handle:
            summaries.append(json.load(handle))
    split_of = [({f: s["data_args"].get(f) for f in SPLIT_FIELDS}, s.get("seed", 42)) for s in summaries]
    if any(split != split_of[0] for split in split_of[1:]):
        raise ValueError(
            f"--run_dir: the runs were tested on different splits ({split_of}); compare runs made with the same "
            f"--split_ratio, --max_test_samples and --seed."
        )
    pairs = test_pairs(summaries[0], args.data_dir)
    data_args = DataArguments(**summaries[0]["data_args"])
    names = [name for summary in summaries for name in summary["results"]]
    report = {}
    for run_dir, summary in zip(args.run_dir, summaries):
        for name in summary["results"]:
            model_dir = os.path.join(run_dir, name)
            model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
            if hasattr(model, "panm"):  # a control model is scored as it was trained (panm_hf.pipelines.controls)
                apply_control(model, summary.get("model_args", {}).get("control"))
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            label = name if names.count(name) == 1 else f"{name}@{os.path.basename(os.path.normpath(run_dir))}"
            report.update(ablations(label, model, tokenizer, pairs, data_args))
            if hasattr(model, "panm"):
                report.update(cut_memory(label, model, tokenizer, pairs, data_args, args.panm_memory_slots))
    for name, tables in report.items():
        for kind, table in tables.items():
            print(f"{name} [{kind}]", {bucket: row["perplexity"] for bucket, row in table.items()})
    if args.output is not None:
        with open(args.output, "w") as handle:
            json.dump({"run_dirs": args.run_dir, "seed": split_of[0][1], "split": split_of[0][0], "report": report},
                      handle, indent=1)  # fmt: skip
    return report


if __name__ == "__main__":
    main()
