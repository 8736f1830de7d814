"""Quickstart: wrap a seq2seq backbone with PANM, train a step, save, reload, generate.

Runs offline in seconds: the backbone is a small random BART built from a config. With
network access, pass a Hub id or a local folder instead (`--backbone facebook/bart-base`).

    python examples/quickstart.py [--backbone PATH_OR_HUB_ID] [--output_dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import AutoModelForSeq2SeqLM, BartConfig

import panm_hf  # noqa: F401  (registers PanmConfig / PanmForSeq2SeqLM with the Auto classes)
from panm_hf import PanmForSeq2SeqLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default=None, help="local folder or Hub id of a seq2seq model")
    parser.add_argument("--output_dir", default=None, help="where to save the wrapped model (default: a temp dir)")
    args = parser.parse_args()

    torch.manual_seed(0)
    if args.backbone is None:
        backbone = AutoModelForSeq2SeqLM.from_config(
            BartConfig(vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
        )
    else:
        backbone = args.backbone
    # 1. Wrap: PANM becomes the decoder's last layer; "stack" starts exactly as the backbone.
    model = PanmForSeq2SeqLM.from_backbone(backbone, placement="stack")
    print(f"backbone {model.config.text_config.model_type}: "
          f"{sum(p.numel() for p in model.backbone.parameters()):,} params, "
          f"PANM adds {sum(p.numel() for p in model.panm.parameters()):,}")

    # 2. One training step on a toy copy batch (labels = inputs).
    input_ids = torch.randint(4, model.config.vocab_size, (8, 12))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    optimizer.step()
    print(f"training loss {loss.item():.3f}")

    # 3. Save and load back through the Auto class.
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="panm_quickstart_")
    model.save_pretrained(output_dir)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(output_dir).eval()
    print(f"saved to {output_dir}; reloaded as {type(reloaded).__name__}")

    # 4. Generate with the PANM state cache (greedy and beam search).
    with torch.no_grad():
        greedy = reloaded.generate(input_ids[:2], max_new_tokens=8)
        beams = reloaded.generate(input_ids[:2], max_new_tokens=8, num_beams=4)
    print("greedy:", greedy.tolist())
    print("beam 4:", beams.tolist())


if __name__ == "__main__":
    main()
