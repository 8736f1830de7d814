"""torch.compile of a whole PANM training step (issue 35: capturing the step is the remedy for host-bound GPUs).

A PANM seq2seq or QA step traces into one graph, with no graph break, under every kernel setting that runs on
CPU (so `mode="reduce-overhead"` can replay it as one CUDA graph on a GPU), from the first call on; and the
compiled step (AOTAutograd: the custom ops' fake and backward registrations) gives eager's loss and gradients; and
a step makes no tensor without a device (a CPU tensor on a GPU run, which CUDA graphs skip); and a compiled step
stores no graph output in the library's cached tables (CUDA graphs overwrite it); and Trainer's
`torch_compile=True` trains it without a graph break.
Dynamo must trace `nn.GRU` (`torch._dynamo.config.allow_rnn`), the Controller's cuDNN GRU on CUDA.
"""

import numpy as np
import pytest
import torch
from conftest import TINY_PANM, VOCAB, _bart_like, activate_panm, make_inputs
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import BartConfig, BertConfig

from panm_hf import PanmConfig, PanmForSeq2SeqLM
from panm_hf.modeling_panm_qa import BertWithPanmForQuestionAnswering

pytestmark = pytest.mark.smoke

EXAMPLE_DESIGN = dict(placement="stack", panm_drop_path=0.5, content_read="decoder", pointer_update="shift")
DESIGNS = {"replace": dict(placement="replace"), "stack": dict(placement="stack"), "example": EXAMPLE_DESIGN}


def seq2seq(design: str, kernel: str) -> PanmForSeq2SeqLM:
    torch.manual_seed(0)
    config = PanmConfig(text_config=_bart_like(BartConfig), recurrence_kernel=kernel, **TINY_PANM,
                        **DESIGNS[design])
    return activate_panm(PanmForSeq2SeqLM(config))


def seq2seq_loss(model):
    input_ids, labels = make_inputs()
    return lambda: model(input_ids=input_ids, labels=labels).loss


def qa_loss(kernel: str):
    torch.manual_seed(0)
    bert = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32)
    model = BertWithPanmForQuestionAnswering(PanmConfig(text_config=bert, recurrence_kernel=kernel, **TINY_PANM))
    input_ids = torch.randint(4, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    start, end = torch.tensor([1, 3]), torch.tensor([2, 6])
    return lambda: model(input_ids=input_ids, start_positions=start, end_positions=end).loss


def graph_breaks(loss) -> tuple[int, list[str]]:
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        explanation = torch._dynamo.explain(loss)()
    return explanation.graph_break_count, [reason.reason.splitlines()[0] for reason in explanation.break_reasons]


@pytest.mark.parametrize("kernel", ["auto", "eager"])
@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_seq2seq_training_step_traces_as_one_graph(design, kernel):
    model = seq2seq(design, kernel).train()
    count, reasons = graph_breaks(seq2seq_loss(model))
    assert count == 0, reasons


@pytest.mark.parametrize("kernel", ["auto", "eager"])
def test_qa_training_step_traces_as_one_graph(kernel):
    count, reasons = graph_breaks(qa_loss(kernel))
    assert count == 0, reasons


FACTORIES = ("empty", "zeros", "ones", "full", "arange", "scalar_tensor", "lift_fresh", "rand", "randn", "randint")


class DevicelessFactories(TorchDispatchMode):
    """Records the tensor factories dispatched without a device: on a GPU they make CPU tensors (a copy to the
    device each step, and a graph CUDA graphs must skip)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in FACTORIES and (kwargs or {}).get("device") is None:
            self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_training_step_makes_every_tensor_on_the_models_device(design):
    model = seq2seq(design, "auto").train()
    input_ids, labels = make_inputs()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)  # as DataCollatorForSeq2Seq does
    step = lambda: model(input_ids=input_ids, decoder_input_ids=decoder_input_ids, labels=labels).loss  # noqa: E731
    step().backward()  # the first call fills the cached tables (built once, on the device)
    with DevicelessFactories() as factories:
        step().backward()
    assert factories.names == []


@pytest.mark.parametrize("design", ["replace", "example"])
def test_compiled_step_gives_eager_loss_and_gradients(design):
    model = seq2seq(design, "auto").eval()  # eval: no dropout and base address 0, so both runs draw nothing
    loss = seq2seq_loss(model)
    eager = loss()
    eager_grads = torch.autograd.grad(eager, list(model.parameters()), allow_unused=True)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        compiled_model = torch.compile(model, backend="aot_eager", fullgraph=True)
        compiled = seq2seq_loss(compiled_model)()
    compiled_grads = torch.autograd.grad(compiled, list(model.parameters()), allow_unused=True)
    assert torch.allclose(compiled, eager, atol=1e-6)
    checked = 0
    for ours, reference in zip(compiled_grads, eager_grads):
        assert (ours is None) == (reference is None)
        if reference is not None:
            assert torch.allclose(ours, reference, atol=1e-5)
            checked += 1
    assert checked > 20  # the backbone's and PANM's parameters, not an empty comparison


def test_compiled_call_stores_no_graph_output_in_the_cached_tables():
    """A compiled step computes a missing table in its graph and stores nothing: a stored graph output lives in a
    CUDA graph's memory pool, which the next replay overwrites (every PANM model failed there on the first H100 call
    under CUDA graphs)."""
    from panm_hf.addressing import _code_table
    from panm_hf.memory import _offset_numerators

    model = seq2seq("example", "auto").eval()
    loss = seq2seq_loss(model)
    eager = loss().detach()
    input_ids, labels = make_inputs()
    returned = sum(isinstance(value, torch.Tensor) for value in model(input_ids=input_ids, labels=labels).values())
    caches = (_code_table, _offset_numerators)
    for cache in caches:
        cache.cache_clear()
    outputs = []

    def count_outputs(graph_module, example_inputs):
        outputs.append(len(next(node for node in graph_module.graph.nodes if node.op == "output").args[0]))
        return graph_module

    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        compiled = seq2seq_loss(torch.compile(model, backend=count_outputs, fullgraph=True))
        first, second = compiled(), compiled()
    assert outputs == [returned]  # one graph, compiled once, whose outputs are the model's (loss, logits, ...)
    assert torch.allclose(first, eager, atol=1e-6) and torch.equal(first, second)
    assert [cache.cache_size() for cache in caches] == [0, 0]  # nothing stored by the compiled calls
    loss()
    assert [cache.cache_size() for cache in caches] == [1, 1]  # an eager call fills them


def test_trainer_torch_compile_trains_one_graph_without_breaks(tmp_path):
    """Trainer's `torch_compile=True` (AOTAutograd's eager backend here: no C++ build in CI) trains PANM."""
    from datasets import Dataset
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, default_data_collator

    model = seq2seq("example", "auto")
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(4, VOCAB, (64, 6), generator=generator)  # (samples, target length)
    data = Dataset.from_dict({
        "input_ids": torch.randint(4, VOCAB, (64, 7), generator=generator).tolist(), "labels": labels.tolist(),
        "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels).tolist(),  # as the collator makes them
    })  # fmt: skip
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=16, learning_rate=3e-3, max_steps=12, logging_steps=4,
        save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True, torch_compile=True,
        torch_compile_backend="aot_eager",
    )  # fmt: skip
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch._dynamo.config.patch(allow_rnn=True):
        trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
        trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    counters = torch._dynamo.utils.counters
    assert counters["stats"]["unique_graphs"] >= 1  # it did compile
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert len(losses) == 3 and all(np.isfinite(losses)) and losses[-1] < losses[0]
