#!/usr/bin/env python
"""How much a trained PANM translation model relies on PANM, and where it gains or loses.

Loads a run of `run_translation.py` (its `results.json` and saved models), rebuilds the same
test split, and reports teacher-forced test perplexity per source-length bucket for:
the Transformer, PANM as trained, and PANM with the Controller's output removed
(`hidden_states` set to zero: for `placement="stack"` that is exactly the backbone path,
for `"residual"` it is `LayerNorm(z_t)`), and, with `content_read="decoder"`, PANM with its
pointer-based reads (Mode 1 and Mode 2) zeroed but the content read kept. A model whose
perplexity does not rise without a part has learned to ignore it.

    python examples/translation/ablate_reads.py --run_dir runs/mt --data_dir ../shared/data/multi30k
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

BUCKETS = ((0, 15), (15, 20), (20, 25), (25, 1000))  # source words, half-open


def test_pairs(summary: dict, data_dir: str):
    """The test split `run_translation.py` evaluated, rebuilt from its recorded arguments."""
    data_args = summary["data_args"]
    seed = summary.get("seed", 42)
    pairs = load_local_pairs(data_dir, data_args["source_lang"], data_args["target_lang"])
    pairs = sample(pairs, data_args["max_pool_samples"], seed)
    _, test = length_split(pairs, data_args["split_ratio"])
    return sample(test, data_args["max_test_samples"], seed)


@torch.no_grad()
def per_sample_nll(model, tokenizer, pairs, data_args, batch_size: int = 100) -> tuple[list[float], list[int]]:
    """Summed token negative log-likelihood and token count of every test pair (teacher forcing)."""
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    dataset = tokenize(pairs, tokenizer, data_args)  # truncated exactly as the run's evaluation was
    totals, counts = [], []
    for start in range(0, len(dataset), batch_size):
        batch = collator([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
        logits = model(**batch).logits  # (batch, tgt_len, vocab)
        nll = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), batch["labels"], ignore_index=-100, reduction="none"
        )  # (batch, tgt_len)
        totals += nll.sum(dim=1).tolist()
        counts += (batch["labels"] != -100).sum(dim=1).tolist()
    return totals, counts


def bucket_perplexity(pairs, totals, counts) -> dict:
    table = {}
    for low, high in BUCKETS:
        chosen = [i for i, source in enumerate(pairs.sources) if low <= len(source.split()) < high]
        if chosen:
            nll = sum(totals[i] for i in chosen) / sum(counts[i] for i in chosen)
            table[f"{low}-{high}"] = {"n": len(chosen), "perplexity": round(math.exp(nll), 2)}
    table["all"] = {"n": len(totals), "perplexity": round(math.exp(sum(totals) / sum(counts)), 2)}
    return table


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run_dir", required=True, help="--output_dir of a run_translation.py run")
    parser.add_argument("--data_dir", required=True, help="Multi30K folder the run used")
    args = parser.parse_args(argv)
    with open(os.path.join(args.run_dir, "results.json")) as handle:
        summary = json.load(handle)
    pairs = test_pairs(summary, args.data_dir)
    data_args = DataArguments(**summary["data_args"])
    report = {}
    for name in summary["results"]:
        model_dir = os.path.join(args.run_dir, name)
        model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        report[name] = bucket_perplexity(pairs, *per_sample_nll(model, tokenizer, pairs, data_args))
        if hasattr(model, "panm"):
            # Remove the Controller's contribution: PanmMemory's output hidden states become zero.
            def zero_output(module, inputs, output):
                output.hidden_states = torch.zeros_like(output.hidden_states)
                return output

            handle = model.panm.register_forward_hook(zero_output)
            report[f"{name} without Controller output"] = bucket_perplexity(
                pairs, *per_sample_nll(model, tokenizer, pairs, data_args)
            )
            handle.remove()
        if getattr(getattr(model, "panm", None), "content_reader", None) is not None:
            # Keep the decoder-queried content read, zero the pointer-based reads (Mode 1 and Mode 2).
            panm = model.panm
            pointer_width = (panm.num_pointer_units + panm.num_mode2_heads) * panm.memory_dim

            def zero_pointer_reads(module, inputs, width=pointer_width):
                reads = inputs[0].clone()  # (batch, steps, num_reads * dim), pointer reads first
                reads[..., :width] = 0
                return (reads, *inputs[1:])

            handle = panm.controller.register_forward_pre_hook(zero_pointer_reads)
            report[f"{name} without pointer reads"] = bucket_perplexity(
                pairs, *per_sample_nll(model, tokenizer, pairs, data_args)
            )
            handle.remove()
    for name, table in report.items():
        print(name, {bucket: row["perplexity"] for bucket, row in table.items()})
    return report


if __name__ == "__main__":
    main()
