"""Regression tests for the defects users reported in issue 36, one section per defect."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import BACKBONES, TINY_PANM, VOCAB, activate_panm, make_inputs, tiny_memory
from torch.nn.utils.rnn import pad_sequence
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    BartModel,
    BertConfig,
    BertForMaskedLM,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
)
from transformers.models.bart.modeling_bart import shift_tokens_right

from panm_hf import BertWithPanmForQA, PanmConfig, PanmForCausalLM, PanmForSeq2SeqLM
from panm_hf.kernels import dispatch, loader

PAD = 1  # the tiny BART's and GPT-2's pad_token_id
PLAIN = {"do_sample": False, "min_length": 0, "no_repeat_ngram_size": 0, "repetition_penalty": 1.0}


def _gpt2_config() -> GPT2Config:
    return GPT2Config(n_embd=16, n_layer=2, n_head=2, n_positions=64, vocab_size=VOCAB, bos_token_id=0,
                      pad_token_id=PAD, eos_token_id=2)  # fmt: skip


def _bert_config() -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=64)  # fmt: skip


def _bart(seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()).eval()


def _panm_parameter_dtypes(model) -> set[torch.dtype]:
    return {p.dtype for name, p in model.named_parameters() if not name.startswith("backbone.")}


def _right_padded(rows: list[torch.Tensor], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` of token ids right-padded with PAD to `width` columns, and their attention mask."""
    input_ids = pad_sequence(rows, batch_first=True, padding_value=PAD)  # (batch, longest)
    input_ids = torch.nn.functional.pad(input_ids, (0, width - input_ids.shape[1]), value=PAD)  # (batch, width)
    lengths = torch.tensor([len(row) for row in rows])
    attention_mask = (torch.arange(width) < lengths[:, None]).long()  # (batch, width)
    return input_ids, attention_mask


# -- 1. PANM's modules take the backbone's dtype ----------------------------------------------------------
@pytest.mark.parametrize("source", ["model", "path"])
def test_bf16_bart_backbone_gives_panm_bf16(source, tmp_path):
    backbone = _bart()
    if source == "model":
        model = PanmForSeq2SeqLM.from_backbone(backbone.to(torch.bfloat16), **TINY_PANM)
    else:
        backbone.save_pretrained(tmp_path)
        model = PanmForSeq2SeqLM.from_backbone(str(tmp_path), backbone_kwargs={"dtype": torch.bfloat16}, **TINY_PANM)
    assert _panm_parameter_dtypes(model) == {torch.bfloat16}
    input_ids, labels = make_inputs()
    out = activate_panm(model).eval()(input_ids=input_ids, labels=labels)
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.loss)


def test_fp16_causal_and_qa_backbones_give_panm_their_dtype():
    torch.manual_seed(0)
    causal = PanmForCausalLM.from_backbone(GPT2LMHeadModel(_gpt2_config()).to(torch.float16), **TINY_PANM).eval()
    qa = BertWithPanmForQA.from_backbone(BertModel(_bert_config()).to(torch.float16), **TINY_PANM).eval()
    input_ids, _ = make_inputs()
    assert _panm_parameter_dtypes(causal) == _panm_parameter_dtypes(qa) == {torch.float16}
    assert causal(input_ids=input_ids).logits.dtype == torch.float16
    assert qa(input_ids=input_ids).start_logits.dtype == torch.float16


# -- 2. The backbone's generation settings are kept and saved -------------------------------------------
def test_backbone_generation_config_is_copied_and_saved(tmp_path):
    backbone = _bart()
    backbone.generation_config.num_beams = 3
    backbone.generation_config.no_repeat_ngram_size = 2
    model = PanmForSeq2SeqLM.from_backbone(backbone, **TINY_PANM)
    assert (model.generation_config.num_beams, model.generation_config.no_repeat_ngram_size) == (3, 2)
    assert model.generation_config is not backbone.generation_config  # a copy: editing one leaves the other
    model.save_pretrained(tmp_path)
    loaded = PanmForSeq2SeqLM.from_pretrained(tmp_path)
    assert (loaded.generation_config.num_beams, loaded.generation_config.no_repeat_ngram_size) == (3, 2)


# -- 3. generate() keeps no per-call state on the model -------------------------------------------------
def test_concurrent_generate_calls_with_different_padding_agree_with_serial_ones():
    torch.manual_seed(0)
    model = PanmForCausalLM.from_backbone(GPT2LMHeadModel(_gpt2_config()), **{**TINY_PANM, "address_bits": 4})
    model = activate_panm(model).eval()
    generator = torch.Generator().manual_seed(0)
    # 12 padding columns shared by both prompts: 2 + 3 new tokens fit in 16 addresses, 14 + 3 would not
    padded = torch.randint(3, VOCAB, (2, 14), generator=generator)
    padded_mask = torch.ones_like(padded)
    padded_mask[:, :12] = 0
    plain = torch.randint(3, VOCAB, (2, 2), generator=generator)
    calls = [(padded.masked_fill(padded_mask == 0, PAD), padded_mask), (plain, torch.ones_like(plain))]

    def generate(input_ids, attention_mask):
        with torch.no_grad():
            return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3, **PLAIN)

    expected = [generate(*call) for call in calls]
    # Both threads enter generate() before either has prepared its generation config, at every call: state
    # one call leaves on the model is then seen by the other call, whatever the scheduler does.
    barrier, prepare = threading.Barrier(2, timeout=10), model._prepare_generation_config

    def prepare_together(*args, **kwargs):
        barrier.wait()
        return prepare(*args, **kwargs)

    model._prepare_generation_config = prepare_together
    results, errors = {0: [], 1: []}, []

    def worker(index):
        try:
            for _ in range(10):
                results[index].append(generate(*calls[index]))
        except Exception as error:  # reported below; the other thread stops waiting
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(index,)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for index in (0, 1):
        assert len(results[index]) == 10 and all(torch.equal(out, expected[index]) for out in results[index])


# -- 4. A backbone of the wrong kind is refused when it is wrapped -------------------------------------
def test_seq2seq_refuses_a_backbone_without_lm_head():
    with pytest.raises(ValueError, match="PanmForSeq2SeqLM needs an encoder-decoder with an LM head.*got BartModel"):
        PanmForSeq2SeqLM.from_backbone(BartModel(BACKBONES["bart"]()), **TINY_PANM)
    with pytest.raises(ValueError, match="PanmForSeq2SeqLM needs an encoder-decoder.*got GPT2LMHeadModel"):
        PanmForSeq2SeqLM.from_backbone(GPT2LMHeadModel(_gpt2_config()), **TINY_PANM)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: GPT2Model(_gpt2_config()), "got GPT2Model, a decoder-only model.*PanmForCausalLM"),
        (lambda: GPT2LMHeadModel(_gpt2_config()), "got GPT2LMHeadModel, a decoder-only model"),
        (lambda: BertForMaskedLM(_bert_config()), r"got BertForMaskedLM, a model with another head.*model\.bert"),
        (_bart, "got the encoder-decoder BartForConditionalGeneration.*PanmForSeq2SeqLM"),
    ],
)
def test_qa_refuses_a_backbone_that_is_not_an_encoder(make, reason):
    with pytest.raises(ValueError, match=f"BertWithPanmForQuestionAnswering needs an encoder.*{reason}"):
        BertWithPanmForQA.from_backbone(make(), **TINY_PANM)


# -- 5. Padding columns do not count against the 2^b addresses -----------------------------------------
def test_seq2seq_batch_padded_past_the_address_space_matches_unpadded_rows():
    model = activate_panm(PanmForSeq2SeqLM.from_backbone(_bart(), **{**TINY_PANM, "address_bits": 4})).eval()
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(4, VOCAB, (length,), generator=generator) for length in (10, 7)]
    labels = torch.randint(4, VOCAB, (2, 5), generator=generator)
    input_ids, attention_mask = _right_padded(rows, width=17)  # 17 columns > 16 addresses
    with torch.no_grad():
        padded = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        for i, row in enumerate(rows):  # each row alone, unpadded
            alone = model(input_ids=row[None], labels=labels[i : i + 1])
            torch.testing.assert_close(padded.logits[i], alone.logits[0], atol=1e-5, rtol=1e-4)
        with pytest.raises(ValueError, match="17 real .*raise address_bits to at least 5"):
            model(input_ids=torch.randint(4, VOCAB, (1, 17)), labels=labels[:1])


def test_qa_batch_padded_past_the_address_space_matches_unpadded_rows():
    torch.manual_seed(0)
    model = BertWithPanmForQA.from_backbone(BertModel(_bert_config()), **{**TINY_PANM, "address_bits": 4})
    model = activate_panm(model).eval()
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(4, VOCAB, (length,), generator=generator) for length in (10, 6)]
    input_ids, attention_mask = _right_padded(rows, width=17)
    with torch.no_grad():
        padded = model(input_ids=input_ids, attention_mask=attention_mask)
        for i, row in enumerate(rows):
            alone = model(input_ids=row[None])
            torch.testing.assert_close(padded.start_logits[i, : len(row)], alone.start_logits[0], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(padded.end_logits[i, : len(row)], alone.end_logits[0], atol=1e-5, rtol=1e-4)


def test_padding_slots_take_addresses_of_real_slots_and_get_no_weight():
    memory = tiny_memory(address_bits=3)  # 8 addresses, 10 columns
    mask = torch.tensor([[1] * 8 + [0] * 2, [0] * 4 + [1] * 6])
    bound = memory.bind(torch.randn(2, 10, 8), mask, base_address=torch.tensor([5, 0]))
    codes = (bound.address_bank * (2 ** torch.arange(2, -1, -1))).sum(-1).long()  # (batch, slots) integers
    assert codes.tolist() == [[5, 6, 7, 0, 1, 2, 3, 4, 4, 4], [0, 0, 0, 0, 0, 1, 2, 3, 4, 5]]
    out = memory(bound, torch.randn(2, 3, 6), output_attentions=True)
    assert out.address_attentions.masked_select(~mask.bool()[:, None, None, :]).abs().max() == 0


# -- 6. Smaller defects ----------------------------------------------------------------------------------
def test_causal_lm_refuses_the_fused_kernel_at_construction():
    config = PanmConfig(text_config=_gpt2_config(), recurrence_kernel="fused", **TINY_PANM)
    with pytest.raises(ValueError, match='PanmForCausalLM cannot run recurrence_kernel="fused".*"auto".*"eager"'):
        PanmForCausalLM(config)


def test_seq2seq_without_decoder_inputs_shifts_input_ids_as_bart_does():
    backbone = _bart()
    model = PanmForSeq2SeqLM.from_backbone(backbone, **TINY_PANM).eval()
    input_ids, _ = make_inputs()
    with torch.no_grad():
        assert torch.equal(model(input_ids=input_ids).logits, backbone(input_ids=input_ids).logits)
        activate_panm(model)
        shifted = shift_tokens_right(input_ids, PAD, backbone.config.decoder_start_token_id)
        expected = model(input_ids=input_ids, decoder_input_ids=shifted).logits
        assert torch.equal(model(input_ids=input_ids).logits, expected)
    torch.manual_seed(0)
    t5 = PanmForSeq2SeqLM.from_backbone(AutoModelForSeq2SeqLM.from_config(BACKBONES["t5"]()), **TINY_PANM)
    with pytest.raises(ValueError, match="'t5' backbone makes none from input_ids: pass decoder_input_ids"):
        t5(input_ids=input_ids)


@pytest.mark.parametrize("placement", ["stack", "replace"])
def test_last_decoder_hidden_state_is_what_the_lm_head_reads(placement):
    model = activate_panm(PanmForSeq2SeqLM.from_backbone(_bart(), placement=placement, **TINY_PANM)).eval()
    input_ids, labels = make_inputs()
    with torch.no_grad():
        out = model(input_ids=input_ids, labels=labels, output_hidden_states=True)
        torch.testing.assert_close(model._logits(out.decoder_hidden_states[-1]), out.logits)
    assert len(out.decoder_hidden_states) == model.config.text_config.decoder_layers + 1 + (placement == "stack")


def test_causal_last_hidden_state_is_what_the_lm_head_reads():
    torch.manual_seed(0)
    model = activate_panm(PanmForCausalLM.from_backbone(AutoModelForCausalLM.from_config(_gpt2_config()),
                                                        **TINY_PANM)).eval()  # fmt: skip
    input_ids, _ = make_inputs()
    with torch.no_grad():
        out = model(input_ids=input_ids, output_hidden_states=True)
        torch.testing.assert_close(model.get_output_embeddings()(out.hidden_states[-1]), out.logits)


@pytest.fixture
def fresh_kernel_cache():
    loader.load_library.cache_clear()
    yield
    loader.load_library.cache_clear()  # later tests load the real kernel again


def test_cached_kernel_without_its_symbols_falls_back_to_eager(fresh_kernel_cache, monkeypatch, tmp_path):
    monkeypatch.setattr(loader, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(loader, "find_compiler", lambda: "/usr/bin/cc")
    monkeypatch.setattr(loader, "_build", lambda *args: None)  # "built": the cached file is foreign
    monkeypatch.setattr(loader.ctypes, "CDLL", lambda path: object())
    reason = loader.load_library("float32")
    assert isinstance(reason, str) and "lacks pointer_forward" in reason
    assert dispatch.unavailable_reason(torch.float32, torch.device("cpu")) == reason
    states, decoder = torch.randn(2, 7, 8), torch.randn(2, 4, 6)
    auto = tiny_memory(recurrence_kernel="auto")(states, decoder).hidden_states
    eager = tiny_memory(recurrence_kernel="eager")(states, decoder).hidden_states
    assert torch.equal(auto, eager)
