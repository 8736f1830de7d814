"""`trust_remote_code=True` loading where panm_hf cannot be imported: every PANM model class in one fresh Python.

Each model is saved with its code (`save_pretrained` copies the modeling files and the kernels), reloaded
through the Auto class in a child process that blocks `panm_hf`, and must give what the saved model gave:
the same seq2seq logits, the same greedy tokens of a causal LM with either memory, the same QA logits.
One child for all four keeps `make test` short (each fresh Python imports transformers and torch).
"""

from __future__ import annotations

import torch
from conftest import BACKBONES, make_inputs, run_without_panm_hf
from conftest import activate_panm as activate_seq2seq
from test_causal_lm import activate_panm as activate_causal
from test_causal_lm import greedy, prompts
from test_causal_lm import wrap as wrap_causal
from test_modeling_panm import wrap as wrap_seq2seq
from test_qa import SMALL_PANM, tiny_bert_config
from test_qa import activate_panm as activate_qa

from panm_hf import PanmConfig
from panm_hf.modeling_panm_qa import BertWithPanmForQuestionAnswering

CHILD = """
import sys
import torch
from transformers import AutoModelForCausalLM, AutoModelForQuestionAnswering, AutoModelForSeq2SeqLM
try:
    import panm_hf  # noqa: F401
    raise SystemExit("panm_hf was importable")
except ImportError:
    pass
root = {root!r}

def load(auto, name):
    return auto.from_pretrained(f"{{root}}/{{name}}", trust_remote_code=True).eval()

probe = torch.load(f"{{root}}/probe.pt")
with torch.no_grad():
    model = load(AutoModelForSeq2SeqLM, "seq2seq")
    logits = model(input_ids=probe["seq2seq_input_ids"], labels=probe["seq2seq_labels"]).logits
    print("seq2seq", type(model).__module__, "-", torch.equal(logits, probe["seq2seq_logits"]))
    for memory in ("sequence", "prompt"):
        model = load(AutoModelForCausalLM, f"causal_{{memory}}")
        out = model.generate(input_ids=probe["prompt_ids"], attention_mask=probe["prompt_mask"], max_new_tokens=4,
                             min_new_tokens=4, do_sample=False, min_length=0, no_repeat_ngram_size=0,
                             repetition_penalty=1.0)
        equal = torch.equal(out, probe[f"causal_{{memory}}_tokens"])
        print(f"causal_{{memory}}", type(model).__module__, model.config.causal_memory, equal)
    model = load(AutoModelForQuestionAnswering, "qa")
    start_logits = model(input_ids=probe["qa_input_ids"]).start_logits
    close = bool((start_logits - probe["qa_start_logits"]).abs().max() < 1e-5)
    print("qa", type(model).__module__, type(model).__name__, close)
"""


def test_every_model_class_loads_with_trust_remote_code_without_panm_hf(tmp_path):
    probe = {}
    _, seq2seq = wrap_seq2seq(BACKBONES["bart"]())
    seq2seq = activate_seq2seq(seq2seq).eval()
    seq2seq.save_pretrained(tmp_path / "seq2seq")
    probe["seq2seq_input_ids"], probe["seq2seq_labels"] = make_inputs()
    prompt_ids, prompt_mask = prompts()
    probe["prompt_ids"], probe["prompt_mask"] = prompt_ids, prompt_mask
    torch.manual_seed(0)
    qa = BertWithPanmForQuestionAnswering(PanmConfig(text_config=tiny_bert_config(), **SMALL_PANM)).eval()
    activate_qa(qa)
    qa.save_pretrained(tmp_path / "qa")
    assert (tmp_path / "qa" / "modeling_panm_qa.py").is_file()
    probe["qa_input_ids"] = torch.randint(1, 99, (2, 8))
    with torch.no_grad():
        probe["seq2seq_logits"] = seq2seq(input_ids=probe["seq2seq_input_ids"], labels=probe["seq2seq_labels"]).logits
        probe["qa_start_logits"] = qa(input_ids=probe["qa_input_ids"]).start_logits
    for memory in ("sequence", "prompt"):
        _, causal = wrap_causal("gpt2", causal_memory=memory)
        causal = activate_causal(causal)
        causal.save_pretrained(tmp_path / f"causal_{memory}")
        probe[f"causal_{memory}_tokens"] = greedy(causal, prompt_ids, prompt_mask, use_cache=True, new_tokens=4)
    torch.save(probe, tmp_path / "probe.pt")

    words = run_without_panm_hf(CHILD.format(root=str(tmp_path)), tmp_path)
    lines = {words[i]: words[i + 1 : i + 4] for i in range(0, len(words), 4)}  # name -> [module, detail, ok]
    assert set(lines) == {"seq2seq", "causal_sequence", "causal_prompt", "qa"}, words
    for name, (module, detail, ok) in lines.items():
        assert module.startswith("transformers_modules") and "panm_hf" not in module, (name, module)
        assert ok == "True", (name, detail)
    assert lines["causal_sequence"][1] == "sequence" and lines["causal_prompt"][1] == "prompt"
    assert lines["qa"][1] == "BertWithPanmForQuestionAnswering"
