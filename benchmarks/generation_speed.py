#!/usr/bin/env python
"""Generation speed of PanmForSeq2SeqLM vs its backbone: greedy and beam search, with and without cache.

Every call generates exactly `--new_tokens` tokens per sequence (min = max new tokens), so
tokens/s = batch * new_tokens / seconds compares like with like. Prints a Markdown table.

    OMP_NUM_THREADS=1 python benchmarks/generation_speed.py --new_tokens 48 --repeats 3
"""

from __future__ import annotations

import argparse

import torch
from timing import time_interleaved
from transformers import AutoModelForSeq2SeqLM, MarianConfig

from panm_hf import PanmConfig, PanmForSeq2SeqLM


def build_models(d_model: int, num_layers: int, vocab_size: int) -> dict:
    backbone = MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=d_model, encoder_layers=num_layers,
        decoder_layers=num_layers, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model, max_position_embeddings=256, pad_token_id=0, eos_token_id=2,
        decoder_start_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    transformer = AutoModelForSeq2SeqLM.from_config(backbone).eval()
    panm = PanmForSeq2SeqLM(
        PanmConfig(
            text_config=backbone.to_dict(),
            placement="replace",
            pointer_hidden_size=d_model,
            controller_hidden_size=d_model,
            mlp_hidden_size=d_model,
        )
    ).eval()
    return {"transformer": transformer, "panm (replace)": panm}


def tokens_per_second(model, input_ids, *, num_beams: int, use_cache: bool, new_tokens: int, repeats: int) -> float:
    kwargs = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "num_beams": num_beams,
        "do_sample": False,
        "use_cache": use_cache,
    }
    with torch.no_grad():
        model.generate(input_ids=input_ids, **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
        best = time_interleaved({"generate": lambda: model.generate(input_ids=input_ids, **kwargs)}, repeats, 0,
                                reduce=min)["generate"]
    return input_ids.shape[0] * new_tokens / best  # min_new_tokens = max_new_tokens: every row generates them all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--num_layers", type=int, default=2)
    parser.add_argument("--vocab_size", type=int, default=2000)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--source_length", type=int, default=24)
    parser.add_argument("--new_tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, args.vocab_size, (args.batch_size, args.source_length), generator=generator)
    print(
        f"d_model={args.d_model}, layers={args.num_layers}, vocab={args.vocab_size}, batch={args.batch_size}, "
        f"source_length={args.source_length}, new_tokens={args.new_tokens}, torch threads={torch.get_num_threads()}"
    )
    print("\n| model | decoding | cache | tokens/s |\n|---|---|---|---:|")
    for name, model in build_models(args.d_model, args.num_layers, args.vocab_size).items():
        for num_beams, label in ((1, "greedy"), (4, "beam 4")):
            for use_cache in (True, False):
                speed = tokens_per_second(
                    model, input_ids, num_beams=num_beams, use_cache=use_cache,
                    new_tokens=args.new_tokens, repeats=args.repeats,
                )  # fmt: skip
                print(f"| {name} | {label} | {'yes' if use_cache else 'no'} | {speed:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
