"""PANM's overhead against its backbone: training throughput, peak memory, generation, scaling.

Every comparison builds the backbone alone and the backbone with PANM in one process and
times them interleaved (backbone step, PANM step, backbone step, ...) after a warm-up, so
machine load hits both alike; figures are medians. Ratios are PANM / backbone.

    python benchmarks/overhead.py                       # all sections, CPU-sized repeats
    python benchmarks/overhead.py --device cuda --repeats 50
    python benchmarks/overhead.py --sections train --cases seq2seq
    python benchmarks/overhead.py --smoke --output /tmp/overhead.json   # every section, tiny models

Cases (issue "Performance"):
  lstm     the algorithmic Copy model: PANM-LSTM vs the LSTM seq2seq baseline (L=10, batch 128)
  seq2seq  a Multi30K-sized Transformer (BART config, 3+3 layers, d_model 512, vocab 8000,
           batch 32 x 24 tokens) vs the same with PANM, placements "stack" and "replace", the
           examples' designs (`panm-example`, `panm-one`) and the one design with input feeding
  qa       BERT-base-sized QA at sequence length 384 vs BertWithPanmForQuestionAnswering
  causal   a GPT-2 (6 layers, d 512, vocab 8000, learned positions; batch 32 x 48 tokens) vs
           PanmForCausalLM on it (issue 16); generation: cached tokens after a 24-token prompt
Peak memory: CUDA's max_memory_allocated on GPU; on CPU the rise of the process's peak RSS
over one training step, measured in a fresh subprocess per model (CPU RSS is coarse).
Section "cost" (no timing): FLOPs of one training step (forward + backward, matmul-class ops,
RNNs counted as their matmuls) and the number of aten ops it dispatches, per variant (PANM with its
default fused recurrences, and again with `recurrence_kernel="eager"`); the FLOP ratio
backbone/PANM is the throughput ratio a purely compute-bound device would reach.
Section "kernels" (CUDA only, not in the default `--sections`): the CUDA kernels one training step
launches, per variant, from torch.profiler's device events, with their summed device time and the kernels that
take most of it, and one cached generation step for seq2seq (`--length` sets L = T).
`--compile MODE` (section train) times every model, backbone and PANM alike, under `torch.compile` (`default`,
`reduce-overhead`, or the `cudagraphs` backend: the step replayed as CUDA graphs without Inductor's code
generation), each alone after three untimed steps whose seconds, graphs, graph breaks and CUDA-graph skips (with
their reasons) the JSON records; the seq2seq batch then carries `decoder_input_ids`, as Trainer's collator makes
them; `--variants` narrows the PANM variants (sections train, cost and kernels).
`--smoke` runs every section on tiny models in seconds (the CI test of this script).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
from timing import time_interleaved
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertForQuestionAnswering,
    GPT2Config,
    GPT2LMHeadModel,
)

from panm_hf import PanmConfig, PanmForCausalLM, PanmForSeq2SeqLM
from panm_hf.cache_panm import BACKBONE_CACHE_KWARG
from panm_hf.modeling_panm_qa import BertWithPanmForQuestionAnswering
from panm_hf.pipelines.seq2seq import PANM_DESIGNS
from research import build_model, make_batch, task_spec

SEQ2SEQ = dict(vocab_size=8000, d_model=512, encoder_layers=3, decoder_layers=3, encoder_attention_heads=8,
               decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=1024,
               dropout=0.1)
CAUSAL = dict(vocab_size=8000, n_embd=512, n_layer=6, n_head=8, n_positions=1024)
# Sizes of each case: the (full) and tiny ones for the CI smoke run of this script.
SIZES = {
    "full": dict(lstm_batch=128, lstm_length=10, panm_lstm={}, lstm={}, seq2seq=SEQ2SEQ, seq2seq_batch=32,
                 seq2seq_length=24, bert={}, qa_batch={"cuda": 8, "cpu": 2}, qa_length=384, panm={},
                 causal=CAUSAL, causal_batch=32, causal_length=48),
    "smoke": dict(lstm_batch=4, lstm_length=4,
                  panm_lstm=dict(memory_dim=16, pointer_hidden_size=16, controller_hidden_size=16, mlp_hidden_size=16),
                  lstm=dict(hidden_size=16),
                  seq2seq=dict(vocab_size=100, d_model=16, encoder_layers=2, decoder_layers=2,
                               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                               decoder_ffn_dim=32, max_position_embeddings=64, dropout=0.1),
                  seq2seq_batch=2, seq2seq_length=6,
                  bert=dict(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=32),
                  qa_batch={"cuda": 2, "cpu": 2}, qa_length=16,
                  panm=dict(pointer_hidden_size=16, controller_hidden_size=16, mlp_hidden_size=16),
                  causal=dict(vocab_size=100, n_embd=16, n_layer=2, n_head=2, n_positions=64), causal_batch=2,
                  causal_length=6),
}


RECURRENCE_KERNEL: str | None = None  # --recurrence-kernel: PanmMemoryConfig.recurrence_kernel of every PANM model


# -- model/batch builders: each returns (model, loss_fn, step_tokens) ----------------------------------
def build_case(case: str, variant: str, device: str, src_len: int | None = None, tgt_len: int | None = None,
               size: str = "full", collated: bool = False):
    """`collated=True`: the seq2seq batch carries `decoder_input_ids` as `DataCollatorForSeq2Seq` makes them, so the
    model does not shift the labels itself (BART's shift writes a CPU scalar, which keeps CUDA graphs off)."""
    model, loss_fn, step_tokens = _build_case(case, variant, device, src_len, tgt_len, size, collated)
    if RECURRENCE_KERNEL is not None:
        set_recurrence_kernel(model, RECURRENCE_KERNEL)
    return model, loss_fn, step_tokens


def _build_case(case: str, variant: str, device: str, src_len: int | None = None, tgt_len: int | None = None,
                size: str = "full", collated: bool = False):
    sizes = SIZES[size]
    torch.manual_seed(0)
    if case == "lstm":
        spec = task_spec("copy")
        length, batch_size = src_len or sizes["lstm_length"], sizes["lstm_batch"]
        model = (build_model("panm", spec.feature_dim, **sizes["panm_lstm"]) if variant == "panm"
                 else build_model("lstm", spec.feature_dim, **sizes["lstm"]))
        batch = make_batch("copy", batch_size, length, generator=torch.Generator().manual_seed(0)).to(device)
        steps = tgt_len or batch.labels.shape[1]

        def loss_fn(m):
            logits = m(batch.inputs, batch.attention_mask, steps).logits
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.labels[:, :steps].flatten(),
                                                     ignore_index=-100)

        return model.to(device), loss_fn, batch_size * steps
    if case == "seq2seq":
        config = BartConfig(**sizes["seq2seq"])
        model = BartForConditionalGeneration(config) if variant == "backbone" else seq2seq_panm(config, variant, sizes)
        generator = torch.Generator().manual_seed(0)
        src, tgt = src_len or sizes["seq2seq_length"], tgt_len or sizes["seq2seq_length"]
        batch_size, vocab = sizes["seq2seq_batch"], config.vocab_size
        inputs = {"input_ids": torch.randint(4, vocab, (batch_size, src), generator=generator).to(device),
                  "labels": torch.randint(4, vocab, (batch_size, tgt), generator=generator).to(device)}
        if collated:
            inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=inputs["labels"])
        return model.to(device), lambda m: m(**inputs).loss, batch_size * tgt
    if case == "qa":
        config = BertConfig(max_position_embeddings=512, **sizes["bert"])
        model = (BertForQuestionAnswering(config) if variant == "backbone"
                 else BertWithPanmForQuestionAnswering(PanmConfig(text_config=config, **sizes["panm"])))
        generator = torch.Generator().manual_seed(0)
        batch_size, seq = sizes["qa_batch"]["cuda" if device == "cuda" else "cpu"], (src_len or sizes["qa_length"])
        inputs = {"input_ids": torch.randint(4, config.vocab_size, (batch_size, seq), generator=generator).to(device),
                  "start_positions": torch.randint(0, seq, (batch_size,), generator=generator).to(device),
                  "end_positions": torch.randint(0, seq, (batch_size,), generator=generator).to(device)}
        return model.to(device), lambda m: m(**inputs).loss, batch_size * seq
    if case == "causal":
        model = causal_model(variant, sizes)
        generator = torch.Generator().manual_seed(0)
        batch_size, length = sizes["causal_batch"], src_len or sizes["causal_length"]
        input_ids = torch.randint(4, model.config.vocab_size, (batch_size, length), generator=generator).to(device)
        return model.to(device), lambda m: m(input_ids=input_ids, labels=input_ids).loss, batch_size * length
    raise ValueError(f"unknown case {case!r}")


# The Multi30K design (`--panm_design multi30k`, the translation and math examples' default before stop 60;
# examples/scan/run_table.py DESIGNS["panm_example"]): shift pointers, the decoder content read, stacked.
PANM_EXAMPLE = dict(placement="stack", panm_drop_path=0.5, content_read="decoder", pointer_update="shift",
                    pointer_hidden_size=128, controller_hidden_size=128)


# The one design, the examples' recommended design since stop 60 (`--panm_design one`, PANM_DESIGNS in
# panm_hf/pipelines/seq2seq.py; run_table.py's `panm_one_design_ek`): the Controller in place of the last decoder
# layer, no decoder positions, a window of 24, the content read keyed by the distance from the end, a 1,024-wide g^o
# reading z_t (dropped for half the samples), dropout on PANM's output and the content read.
PANM_ONE = PANM_DESIGNS["one"]
# the one design with input feeding (issue 34, point 27): the decoder and the Controller one target token at a time
DESIGNS = {"panm-example": PANM_EXAMPLE, "panm-one": PANM_ONE, "panm-one-fed": {**PANM_ONE, "input_feeding": True}}


def seq2seq_panm(config: BartConfig, variant: str, sizes: dict) -> PanmForSeq2SeqLM:
    """PANM on the seq2seq case's BART: `panm-stack`, `panm-replace` (the paper's defaults), `panm-example`,
    `panm-one` or `panm-one-fed`."""
    design = DESIGNS.get(variant, {"placement": variant.split("-")[1]})
    return PanmForSeq2SeqLM(PanmConfig(text_config=config, **{**design, **sizes["panm"]}))


def causal_model(variant: str, sizes: dict):
    """The GPT-2 of the "causal" case alone, or wrapped by PanmForCausalLM."""
    torch.manual_seed(0)
    config = GPT2Config(bos_token_id=0, eos_token_id=2, pad_token_id=1, **sizes["causal"])
    if variant == "backbone":
        return GPT2LMHeadModel(config)
    return PanmForCausalLM(PanmConfig(text_config=config, **sizes["panm"]))


VARIANTS = {"lstm": ["backbone", "panm"],
            "seq2seq": ["backbone", "panm-stack", "panm-replace", "panm-example", "panm-one", "panm-one-fed"],
            "qa": ["backbone", "panm"], "causal": ["backbone", "panm"]}


def train_step(model, loss_fn, optimizer, mark_step: bool = False) -> None:
    if mark_step:  # CUDA graphs (torch.compile's "reduce-overhead"): a new step may overwrite the last one's outputs
        torch.compiler.cudagraph_mark_step_begin()
    loss = loss_fn(model)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


GRAPHED = ("reduce-overhead", "cudagraphs")  # --compile modes that replay CUDA graphs


class CudagraphSkips(logging.Handler):
    """The reasons torch.compile gives for running a graph without CUDA graphs (its "cudagraphs" log)."""

    def __init__(self):
        super().__init__()
        self.reasons: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "skipping cudagraphs" in message:
            self.reasons.add(message.splitlines()[0][:200])


def compiled_step_seconds(model, loss_fn, optimizer, mode: str, args) -> dict:
    """Seconds per training step of `torch.compile(model, mode=mode)`, timed alone (CUDA graph trees of two models
    interleaved step by step failed on torch 2.11), after three untimed steps (compile, warm-up, CUDA graph
    recording) whose seconds it reports, with the graphs and graph breaks Dynamo reported and why CUDA graphs
    skipped a graph."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    skips = CudagraphSkips()
    log = logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs")
    log.addHandler(skips)
    try:
        options = {"backend": "cudagraphs"} if mode == "cudagraphs" else {"mode": None if mode == "default" else mode}
        step_model = torch.compile(model, **options)
        run = lambda: train_step(step_model, loss_fn, optimizer, mark_step=mode in GRAPHED)  # noqa: E731
        start = time.perf_counter()
        for _ in range(3):
            run()
        compile_s = time.perf_counter() - start
        step_s = time_interleaved({"step": run}, args.repeats, args.warmup, args.device)["step"]
    finally:
        log.removeHandler(skips)
    counters = torch._dynamo.utils.counters
    return {"step_s": step_s, "compile_s": compile_s, "graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values()),
            "break_reasons": sorted({reason.splitlines()[0][:160] for reason in counters["graph_break"]}),
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"], "cudagraph_skip_reasons": sorted(skips.reasons)}


def chosen_variants(case: str, args) -> list[str]:
    """The case's variants, narrowed by `--variants` (the backbone always runs)."""
    chosen = args.variants.split(",") if getattr(args, "variants", None) else None
    known = {variant for variants in VARIANTS.values() for variant in variants}
    if chosen is not None and (unknown := sorted(set(chosen) - known)):
        raise ValueError(f"--variants names unknown variants {unknown}; choose from {sorted(known)}.")
    return [v for v in VARIANTS[case] if chosen is None or v == "backbone" or v in chosen]


def bench_train(case: str, args) -> dict:
    runs, tokens, rows = {}, {}, {}
    for variant in chosen_variants(case, args):
        model, loss_fn, tokens[variant] = build_case(case, variant, args.device, size=args.size,
                                                     collated=args.compile is not None)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if not args.compile:
            runs[variant] = (lambda m=model, f=loss_fn, o=optimizer: train_step(m, f, o))
            continue
        try:  # a failing compile is a result: recorded, the variant not timed
            rows[variant] = compiled_step_seconds(model, loss_fn, optimizer, args.compile, args)
        except Exception as error:  # noqa: BLE001
            rows[variant] = {"compile_error": f"{type(error).__name__}: {str(error)[:300]}"}
        del model, optimizer
        if args.device == "cuda":
            torch.cuda.empty_cache()
    for variant, seconds in time_interleaved(runs, args.repeats, args.warmup, args.device).items():
        rows[variant] = {"step_s": seconds, "peak_memory_mb": peak_memory(case, variant, args)}
    result = {}
    for variant, row in rows.items():
        if "step_s" in row:
            row["tokens_per_s"] = tokens[variant] / row["step_s"]
        result[variant] = row
    base = result["backbone"]
    for row in result.values():
        if "tokens_per_s" not in row or "tokens_per_s" not in base:
            continue
        row["throughput_ratio"] = row["tokens_per_s"] / base["tokens_per_s"]
        if row.get("peak_memory_mb") and base.get("peak_memory_mb"):
            row["memory_ratio"] = row["peak_memory_mb"] / base["peak_memory_mb"]
    return result


def peak_memory(case: str, variant: str, args) -> float | None:
    if args.device == "cuda":
        model, loss_fn, _ = build_case(case, variant, "cuda", size=args.size)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        train_step(model, loss_fn, optimizer)  # optimizer state allocated
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        train_step(model, loss_fn, optimizer)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20
    kernel = ["--recurrence-kernel", RECURRENCE_KERNEL] if RECURRENCE_KERNEL else []
    probe = subprocess.run([sys.executable, __file__, "--memory-probe", case, variant, args.size, *kernel],
                           capture_output=True, text=True, check=True)
    return float(probe.stdout.strip().splitlines()[-1])


def memory_probe(case: str, variant: str, size: str) -> None:
    """CPU: peak-RSS rise (MB) over a training step after a first step allocated the optimizer state."""
    model, loss_fn, _ = build_case(case, variant, "cpu", size=size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_step(model, loss_fn, optimizer)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(2):
        train_step(model, loss_fn, optimizer)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    params_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    # parameters + grads + Adam moments + the step's transient peak
    print(4 * params_mb + (after - before) / 1024)


def generation_models(family: str, args) -> tuple[dict, torch.Tensor]:
    """Eval-mode models of one family (backbone first) and the prompts/sources they generate from."""
    sizes = SIZES[args.size]
    if family == "causal":
        models = {variant: causal_model(variant, sizes) for variant in VARIANTS["causal"]}
        vocab, length = sizes["causal"]["vocab_size"], sizes["seq2seq_length"]
    else:
        config = BartConfig(**{**sizes["seq2seq"], "dropout": 0.0})
        torch.manual_seed(0)
        models = {"backbone": BartForConditionalGeneration(config)}
        for placement in ("replace", "stack"):
            models[f"panm-{placement}"] = PanmForSeq2SeqLM(PanmConfig(text_config=config, placement=placement,
                                                                      **sizes["panm"]))
        vocab, length = config.vocab_size, sizes["seq2seq_length"]
    models = {name: model.to(args.device).eval() for name, model in models.items()}
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, vocab, (args.gen_batch, length), generator=generator).to(args.device)
    return models, input_ids


def bench_generate(args) -> dict:
    """Cached generation, backbone vs PANM (seq2seq: both placements; causal with `--cases` causal).

    Per-token time ratio PANM/backbone; seq2seq rows are named "greedy"/"beam4", causal ones
    "causal-greedy"/"causal-beam4".
    """
    families = ["seq2seq"] + (["causal"] if "causal" in args.cases.split(",") else [])
    result = {}
    for family in families:
        models, input_ids = generation_models(family, args)
        prefix = "causal-" if family == "causal" else ""
        for beams in (1, 4):
            kwargs = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, num_beams=beams,
                          do_sample=False)

            def run(model, kwargs=kwargs, input_ids=input_ids):
                with torch.no_grad():
                    model.generate(input_ids, **kwargs)

            medians = time_interleaved({name: (lambda m=model: run(m)) for name, model in models.items()},
                                       args.gen_repeats, 1, args.device)
            tokens = args.gen_batch * args.new_tokens
            name = prefix + ("greedy" if beams == 1 else f"beam{beams}")
            result[name] = {variant: {"tokens_per_s": tokens / s, "ms_per_token": 1000 * s / args.new_tokens,
                                      "per_token_time_ratio": s / medians["backbone"]}
                            for variant, s in medians.items()}
        for variant, model in models.items():  # kernels one more greedy token dispatches (no timing)
            result[prefix + "greedy"][variant]["aten_ops_per_token"] = ops_per_generated_token(model, input_ids)
    return result


def ops_per_generated_token(model, input_ids: torch.Tensor, tokens: int = 4) -> float:
    """Aten ops of greedy generation with `2 * tokens` new tokens minus `tokens`, per token (prefill cancels)."""
    counts = []
    for new_tokens in (tokens, 2 * tokens):
        counter = OpCounter()
        with torch.no_grad(), counter:
            model.generate(input_ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        counts.append(counter.count)
    return (counts[1] - counts[0]) / tokens


def bench_scaling(args) -> dict:
    """PANM's share of a training step as the input length L and output length T grow (to 8x)."""
    sizes, curve = SIZES[args.size], []
    factors = (1, 2) if args.size == "smoke" else (1, 2, 4, 8)
    for case, panm, base_length in (("lstm", "panm", sizes["lstm_length"]),
                                    ("seq2seq", "panm-replace", sizes["seq2seq_length"])):
        for factor in factors:
            length = base_length * factor  # L = T
            runs = {}
            for variant in ("backbone", panm):
                model, loss_fn, _ = build_case(case, variant, args.device, src_len=length, tgt_len=length,
                                               size=args.size)
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
                runs[variant] = (lambda m=model, f=loss_fn, o=optimizer: train_step(m, f, o))
            medians = time_interleaved(runs, max(3, args.repeats // 2), 1, args.device)
            curve.append({"case": case, "L": length, "T": length, "backbone_step_s": medians["backbone"],
                          "panm_step_s": medians[panm], "ratio": medians["backbone"] / medians[panm]})
            print(f"  scaling {case} L=T={length}: backbone {medians['backbone'] * 1e3:.1f} ms, "
                  f"panm {medians[panm] * 1e3:.1f} ms", flush=True)
    return {"curve": curve}


# PANM's custom ops that run a Triton port (`recurrence_kernel="triton"` on any device, and the CUDA kernels of
# the plain ops): the recurrences and the reads -> the port's module in `panm_hf.kernels` and its Python wrapper,
# which allocates, reduces and launches.
TRITON_WRAPPERS = {"panm_hf::pointer_recurrence_triton": ("triton_port", "pointer_forward_triton"),
                   "panm_hf::pointer_recurrence_triton_backward": ("triton_port", "pointer_backward_triton"),
                   "panm_hf::pointer_recurrence": ("triton_port", "pointer_forward_triton"),
                   "panm_hf::pointer_recurrence_backward": ("triton_port", "pointer_backward_triton"),
                   "panm_hf::shift_recurrence_triton": ("triton_shift", "shift_forward_triton"),
                   "panm_hf::shift_recurrence_triton_backward": ("triton_shift", "shift_backward_triton"),
                   "panm_hf::shift_recurrence": ("triton_shift", "shift_forward_triton"),
                   "panm_hf::shift_recurrence_backward": ("triton_shift", "shift_backward_triton"),
                   "panm_hf::gru_recurrence_triton": ("triton_gru", "gru_forward_triton"),
                   "panm_hf::gru_recurrence_triton_backward": ("triton_gru", "gru_backward_triton"),
                   "panm_hf::gru_recurrence": ("triton_gru", "gru_forward_triton"),
                   "panm_hf::gru_recurrence_backward": ("triton_gru", "gru_backward_triton"),
                   **{f"panm_hf::{op}{suffix}": ("triton_reads", f"{op}{kind}_triton")
                      for op in ("normalize_rows", "mode2_attention", "masked_pool")
                      for suffix, kind in (("_triton", ""), ("_triton_backward", "_backward"), ("", ""),
                                           ("_backward", "_backward"))}}


def triton_wrapper(func, args):
    """The Triton port's wrapper that runs `func` on these arguments, or None (any other op, or the C kernel)."""
    module, name = TRITON_WRAPPERS.get(func._schema.name, (None, None))
    port = sys.modules.get(f"panm_hf.kernels.{module}")
    if name is None or port is None:
        return None
    on_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    return getattr(port, name) if on_cuda or func._schema.name.endswith(("_triton", "_triton_backward")) else None


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched (forward and backward), the kernels a step launches.

    A custom op is one op (the C kernels), except the Triton ports': their wrappers' aten ops (allocations,
    copies to contiguous, the gradient reductions) are counted, and each Triton launch as exactly one op
    (`triton_port.launches`; the ops Triton's interpreter runs inside a launch are not counted).
    """

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        wrapper = triton_wrapper(func, args)
        if wrapper is None:
            self.count += 1
            return func(*args, **(kwargs or {}))
        port = sys.modules["panm_hf.kernels.triton_port"]
        launches = port.launches
        with OpCounter() as glue:
            out = wrapper(*args, **(kwargs or {}))
        self.count += glue.count + port.launches - launches
        return out


def step_cost(loss_fn, model: torch.nn.Module | None = None) -> dict:
    """FLOPs and aten ops of one forward + backward of `loss_fn()` (the optimizer step is elementwise).

    FLOPs count matmul-class ops only; oneDNN is switched off for that pass so RNN layers run as
    their matmuls and are counted. The op count is taken on the normal execution path, from `.grad` cleared
    as a training step leaves it (`zero_grad(set_to_none=True)`: the gradients are stored, not accumulated).
    """
    with warnings.catch_warnings():  # toggling oneDNN warns about TF32 on Intel GPUs
        warnings.simplefilter("ignore", UserWarning)
        with torch.backends.mkldnn.flags(enabled=False), FlopCounterMode(display=False) as flops:
            loss_fn().backward()
    return {"gflops": flops.get_total_flops() / 1e9, "aten_ops": counted_step(loss_fn, model)}


def counted_step(loss_fn, model: torch.nn.Module | None, counter=None) -> int:
    """Aten ops of one forward + backward of `loss_fn()`, `model`'s gradients cleared first as `train_step` does
    (with `counter=KernelCounter`, the CUDA kernels it launches)."""
    if model is not None:
        model.zero_grad(set_to_none=True)
    counter = (counter or OpCounter)()
    with counter:
        loss_fn().backward()
    return counter.count


def set_recurrence_kernel(model, kernel: str) -> None:
    """Switch every PANM part with a `recurrence_kernel` (Pointer Units, Controller) to `kernel` (`"triton"`: the
    code path CUDA's `"auto"` takes)."""
    for module in model.modules():
        if hasattr(module, "recurrence_kernel"):
            module.recurrence_kernel = kernel


class KernelCounter:
    """Counts the CUDA kernels (and device memcpy / memset) launched inside the block, from torch.profiler's
    device-side events: what a GPU step costs in launches, where `OpCounter` is the dispatch-level proxy."""

    def __init__(self):
        self.count = 0
        self.device_us: dict[str, float] = {}  # kernel name -> summed device time (microseconds)

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        self.profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        self.profiler.__enter__()
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.profiler.__exit__(*exc)
        cuda = torch.autograd.DeviceType.CUDA
        events = [event for event in self.profiler.events() if event.device_type == cuda]
        self.count = len(events)
        for event in events:
            self.device_us[event.name] = self.device_us.get(event.name, 0.0) + event.time_range.elapsed_us()
        return False

    def top(self, n: int = 8) -> list[list]:
        """The `n` kernels with the most device time: [name (cut to 80 characters), microseconds]."""
        ranked = sorted(self.device_us.items(), key=lambda item: -item[1])[:n]
        return [[name[:80], round(us, 1)] for name, us in ranked]


def bench_kernels(case: str, args) -> dict:
    """CUDA kernels per training step (forward + backward, after a warm-up step that compiles the Triton
    kernels) per variant, PANM with its default kernels (`--recurrence-kernel` to choose); the seq2seq case
    adds one cached generation step. CUDA only."""
    if args.device != "cuda":
        raise ValueError("--sections kernels counts CUDA kernels: run it with --device cuda (use `cost` on CPU).")
    result = {}
    for variant in chosen_variants(case, args):
        model, loss_fn, _ = build_case(case, variant, args.device, src_len=args.length, tgt_len=args.length,
                                       size=args.size)
        model.train()
        if variant != "backbone":
            set_recurrence_kernel(model, RECURRENCE_KERNEL or "auto")
        counted_step(lambda m=model, f=loss_fn: f(m), model)  # warm-up: Triton compiles, cuDNN plans
        counter = KernelCounter()
        counted_step(lambda m=model, f=loss_fn: f(m), model, lambda c=counter: c)
        row = {"kernels": counter.count, "device_ms": sum(counter.device_us.values()) / 1e3,
               "top_kernels_us": counter.top()}
        if case == "seq2seq":
            cached_step_ops(model, args.device, args.size)
            row["gen_step_kernels"] = cached_step_ops(model, args.device, args.size, counter=KernelCounter)
        result[variant] = row
    base = result["backbone"]
    for row in result.values():
        row["kernel_ratio"] = row["kernels"] / base["kernels"]
        if "gen_step_kernels" in row:
            row["gen_kernel_ratio"] = row["gen_step_kernels"] / base["gen_step_kernels"]
    return result


def cached_step_ops(model, device: str, size: str, prefix: int = 4, counter=None) -> int:
    """Aten ops of one cached decoding step of the seq2seq case: one new target token with the cache,
    after the encoder and a `prefix`-token decoder pass filled the cache (eval mode, no gradients); with
    `counter=KernelCounter`, the CUDA kernels it launches."""
    sizes = SIZES[size]
    generator = torch.Generator().manual_seed(0)
    vocab, batch_size, length = sizes["seq2seq"]["vocab_size"], sizes["seq2seq_batch"], sizes["seq2seq_length"]
    input_ids = torch.randint(4, vocab, (batch_size, length), generator=generator).to(device)
    target = torch.randint(4, vocab, (batch_size, prefix + 1), generator=generator).to(device)
    attention_mask = torch.ones_like(input_ids)
    model.eval()
    counter = (counter or OpCounter)()
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        inputs = dict(encoder_outputs=encoder_outputs, attention_mask=attention_mask, use_cache=True)
        past = getattr(model(decoder_input_ids=target[:, :prefix], **inputs), BACKBONE_CACHE_KWARG)
        with counter:  # the cache under the backbone's own name (`cache` from transformers 5.24)
            model(decoder_input_ids=target[:, prefix:], **{BACKBONE_CACHE_KWARG: past}, **inputs)
    model.train()
    return counter.count


def bench_cost(case: str, args) -> dict:
    """Step cost per variant; PANM's aten ops with its default kernels (fused recurrences where they apply)
    and with `recurrence_kernel="eager"` (the step-by-step reference), for comparison. FLOPs are counted on
    the eager path: the FLOP counter cannot see inside the fused kernels. The seq2seq case adds the aten ops
    of one cached generation step (`gen_step_ops`, with the variant's kernels); the LSTM case's research
    models have no token-by-token generation (they decode a fixed number of steps from the memory)."""
    result = {}
    for variant in chosen_variants(case, args):
        model, loss_fn, step_tokens = build_case(case, variant, args.device, size=args.size)
        model.train()
        if variant == "backbone":
            row = {**step_cost(lambda m=model, f=loss_fn: f(m), model), "step_tokens": step_tokens}
        else:
            set_recurrence_kernel(model, "eager")
            eager = step_cost(lambda m=model, f=loss_fn: f(m), model)
            set_recurrence_kernel(model, RECURRENCE_KERNEL or "auto")
            ops = counted_step(lambda m=model, f=loss_fn: f(m), model)
            row = {"gflops": eager["gflops"], "aten_ops": ops, "aten_ops_eager": eager["aten_ops"],
                   "step_tokens": step_tokens}
        if case == "seq2seq":
            row["gen_step_ops"] = cached_step_ops(model, args.device, args.size)
        result[variant] = row
    base = result["backbone"]
    for row in result.values():
        row["flop_ratio"] = base["gflops"] / row["gflops"]  # the compute-bound ceiling of the throughput ratio
        row["op_ratio"] = row["aten_ops"] / base["aten_ops"]
        row["op_ratio_eager"] = row.get("aten_ops_eager", base["aten_ops"]) / base["aten_ops"]
        if "gen_step_ops" in row:
            row["gen_op_ratio"] = row["gen_step_ops"] / base["gen_step_ops"]
    return result


def per_case(bench, args, section: str, describe) -> dict:
    """Run `bench(case, args)` for every case of `--cases`, printing one line per variant."""
    results = {}
    for case in args.cases.split(","):
        results[case] = bench(case, args)
        for variant, row in results[case].items():
            print(f"{section:5s} {case:8s} {variant:13s} {describe(row)}", flush=True)
    return results


def describe_train(row: dict) -> str:
    if "compile_error" in row:
        return f"compile failed: {row['compile_error']}"
    line = (f"{row['tokens_per_s']:10.0f} tok/s  ratio {row.get('throughput_ratio', float('nan')):.3f}  "
            f"peak {row.get('peak_memory_mb') or 0:8.1f} MB  mem ratio {row.get('memory_ratio', float('nan')):.3f}")
    if "compile_s" in row:
        line += (f"  compiled in {row['compile_s']:.1f} s, {row['graphs']} graphs, {row['graph_breaks']} breaks, "
                 f"{row['cudagraph_skips']} cudagraph skips {row['cudagraph_skip_reasons']}")
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sections", default="train,generate,scaling,cost")
    parser.add_argument("--cases", default="lstm,seq2seq,qa,causal")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--gen-batch", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--gen-repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--output", default="docs/results/overhead.json")
    parser.add_argument("--smoke", action="store_true", help="tiny models, 1 repeat, 4 new tokens (seconds)")
    parser.add_argument("--recurrence-kernel", choices=("auto", "eager", "fused", "triton"),
                        default=None,
                        help="PanmMemoryConfig.recurrence_kernel for every PANM model (default: the config's, auto); "
                             "fused on CUDA runs the Triton kernel (the cost section always reports eager beside)")
    parser.add_argument("--compile", choices=("default", "reduce-overhead", "cudagraphs"), default=None,
                        help="section train: time every model under torch.compile with this mode (reduce-overhead: "
                             "Inductor and CUDA graphs; cudagraphs: the backend of that name, CUDA graphs without "
                             "Inductor), after one compiling step; RNN modules are traced (Dynamo's allow_rnn)")
    parser.add_argument("--variants", default=None,
                        help="sections train, cost, kernels: only these PANM variants (comma-separated; "
                             "the backbone always runs)")
    parser.add_argument("--length", type=int, default=None,
                        help="section kernels: L = T for the lstm and seq2seq cases (default: the cases' own)")
    parser.add_argument("--memory-probe", nargs=3, metavar=("CASE", "VARIANT", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    global RECURRENCE_KERNEL
    RECURRENCE_KERNEL = args.recurrence_kernel
    args.size = "smoke" if args.smoke else "full"
    if args.compile:  # nn.GRU / nn.LSTM (the Controller on cuDNN, the LSTM case) break the graph unless traced
        torch._dynamo.config.allow_rnn = True
    if args.smoke:
        args.repeats, args.warmup, args.gen_repeats, args.new_tokens = 1, 1, 1, 4
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        memory_probe(*args.memory_probe)
        return

    report = {"device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
              "threads": torch.get_num_threads(), "torch": torch.__version__, "command": " ".join(sys.argv),
              "compile": args.compile}
    sections = args.sections.split(",")
    if "train" in sections:
        report["train"] = per_case(bench_train, args, "train", describe_train)
    if "generate" in sections:
        report["generate"] = bench_generate(args)
        for name, rows in report["generate"].items():
            for variant, row in rows.items():
                ops = f"  {row['aten_ops_per_token']:.0f} aten ops/token" if "aten_ops_per_token" in row else ""
                print(f"generate {name:7s} {variant:13s} {row['tokens_per_s']:8.1f} tok/s  per-token time ratio "
                      f"{row['per_token_time_ratio']:.3f}{ops}", flush=True)
    if "scaling" in sections:
        report["scaling"] = bench_scaling(args)
    if "cost" in sections:
        report["cost"] = per_case(bench_cost, args, "cost", lambda row: (
            f"{row['gflops']:9.2f} GFLOP/step  flop ratio {row['flop_ratio']:.3f}  "
            f"{row['aten_ops']:6d} aten ops  op ratio {row['op_ratio']:.2f}  "
            f"(eager recurrences: {row.get('aten_ops_eager', row['aten_ops']):6d}, {row['op_ratio_eager']:.2f})"
            + (f"  cached step {row['gen_step_ops']:5d} ops, ratio {row['gen_op_ratio']:.2f}"
               if "gen_step_ops" in row else "")))
    if "kernels" in sections:
        report["kernels"] = per_case(bench_kernels, args, "kernels", lambda row: (
            f"{row['kernels']:6d} CUDA kernels per step  ratio {row['kernel_ratio']:.2f}  "
            f"device {row['device_ms']:6.2f} ms  top {row['top_kernels_us'][:3]}"
            + (f"  cached step {row['gen_step_kernels']:5d}, ratio {row['gen_kernel_ratio']:.2f}"
               if "gen_step_kernels" in row else "")))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
