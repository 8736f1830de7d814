"""Seq2SeqTrainer with `predict_with_generate=True` trains and evaluates a PanmForSeq2SeqLM."""

from __future__ import annotations

import numpy as np
import torch
from datasets import Dataset
from transformers import BartConfig, Seq2SeqTrainer, Seq2SeqTrainingArguments, default_data_collator

from panm_hf import PanmConfig, PanmForSeq2SeqLM

VOCAB, PAD, EOS, START = 24, 1, 2, 0
SEQ_LEN = 5


def copy_task(num_samples: int, seed: int) -> Dataset:
    """Copy a random token string; fixed lengths so the default collator can stack them."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, VOCAB, (num_samples, SEQ_LEN), generator=generator)  # (samples, len)
    eos = torch.full((num_samples, 1), EOS)
    sequences = torch.cat([tokens, eos], dim=1).tolist()  # (samples, len + 1)
    return Dataset.from_dict(
        {"input_ids": sequences, "attention_mask": [[1] * (SEQ_LEN + 1)] * num_samples, "labels": sequences}
    )


def build_model() -> PanmForSeq2SeqLM:
    torch.manual_seed(0)
    backbone = BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=START, decoder_start_token_id=START,
        forced_eos_token_id=None,
    )  # fmt: skip
    config = PanmConfig(
        text_config=backbone.to_dict(),
        address_bits=4,
        pointer_hidden_size=32,
        controller_hidden_size=32,
        mlp_hidden_size=32,
        placement="replace",
    )
    return PanmForSeq2SeqLM(config)


def test_seq2seq_trainer_trains_and_predicts_with_generate(tmp_path):
    model = build_model()
    # Seq2SeqTrainer pads predictions to model.generation_config.max_length (not generation_max_length).
    model.generation_config.max_length = SEQ_LEN + 2
    train, evaluation = copy_task(256, seed=0), copy_task(16, seed=1)
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=16,
        per_device_eval_batch_size=8,
        learning_rate=3e-3,
        num_train_epochs=4,
        logging_steps=16,
        save_strategy="no",
        report_to=[],
        predict_with_generate=True,
        generation_max_length=SEQ_LEN + 2,
        generation_num_beams=2,
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Seq2SeqTrainer(
        model=model, args=args, train_dataset=train, eval_dataset=evaluation, data_collator=default_data_collator
    )
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert np.isfinite(after) and after < 0.9 * before

    prediction = trainer.predict(evaluation)
    predictions = prediction.predictions
    assert predictions.shape == (len(evaluation), SEQ_LEN + 2)
    assert predictions.min() >= 0 and predictions.max() < VOCAB
    assert (predictions[:, 0] == START).all()  # generation starts from decoder_start_token_id
