"""A joint source/target BPE tokenizer trained locally with `tokenizers` (no Hub).

Metaspace pre-tokenisation (SentencePiece-style `▁` word marks) makes decoding
reversible, so generated ids detokenise to plain text for sacreBLEU.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a BPE tokenizer on `texts`; every encoded sequence ends with `</s>`.

    Args:
        texts: training sentences of both languages (only the training split: the test
            split must not leak into the vocabulary).
        vocab_size: size of the joint vocabulary, special tokens included.
    """
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, UNK, BOS, EOS], min_frequency=2)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    eos_id = tokenizer.token_to_id(EOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, eos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, unk_token=UNK, bos_token=BOS, eos_token=EOS
    )
