"""The seq2seq examples' models and Trainer (translation, math, bAbI, SCAN): one owner for what they share.

`ModelArguments` (which models, the backbone's size, the placement), the random Marian / BART / T5
backbone built from those flags (`backbone_config`), the plain or PANM model (`build_model`), the
smoke budget (`apply_smoke`) and the `Seq2SeqTrainer` that decays PANM's weights at their own rate
(`model_trainer`). Each example script subclasses `ModelArguments` for its own defaults and keeps its
data pipeline beside it; this module is installed with the package so `python examples/<task>/run_<task>.py`
needs no path edits. It needs the `examples` extra (`pip install -e ".[examples]"`).
"""

from __future__ import annotations

import copy
import os
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    BartConfig,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    MarianConfig,
    PreTrainedModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    T5Config,
)

from panm_hf import PanmConfig, PanmForSeq2SeqLM, PanmMemoryConfig
from panm_hf.configuration_panm import LAYER_REPLACING_PLACEMENTS
from panm_hf.decoder_positions import DECODER_POSITIONS, DEFAULTS, load_relative_bias, record, recorded
from panm_hf.decoder_positions import apply as apply_decoder_positions
from panm_hf.pipelines.controls import apply_control, validate_control
from panm_hf.pipelines.script_conventions import gather_from_ranks, load_pretrained
from panm_hf.pipelines.weight_average import WeightAverageCallback, validate_weight_average_decay

MODELS = ("transformer", "panm")
BACKBONES = ("marian", "bart", "t5")
# The bAbI example's PANM flags: the measured best there for a Transformer trained from scratch
# (docs/results/transformer_integration.md); PanmMemoryConfig's own defaults are the paper's.
RECOMMENDED_PANM_FLAGS = {"content_read": "decoder", "pointer_update": "shift"}
# PANM designs by name (`--panm_design`), each a value for every flag any of them sets, so that one replaces another
# whole; the translation, math and SCAN examples default to "one". The two decoder flags apply to the Transformer of
# `--model both` too.
PAPER_DESIGN = {
    "placement": "replace", "panm_drop_path": 0.0, "content_read": "none", "content_read_keys": "memory",
    "pointer_update": "attention", "output_decoder_input": False, "mlp_hidden_size": 128,
    "output_decoder_drop_path": 0.0, "panm_dropout": 0.0, "reads_dropout": None, "content_read_dropout": None,
    "decoder_positions": "absolute", "decoder_window": 0,
}  # fmt: skip
PANM_DESIGNS = {
    # the paper's integration: the Controller in place of the last decoder layer, PanmMemoryConfig's defaults
    "paper": PAPER_DESIGN,
    # the one design (docs/results/scan.md#one-design-for-three-tasks): the paper's integration with the decoder
    # content read keyed by `M` and each slot's distance from the end, `g^o` 1,024 wide and reading the decoder state
    # `z_t` too (for half the training samples without it), dropout 0.3 on PANM's output and on the content read (none
    # on the pointer reads), and a decoder without absolute positions whose self-attention sees its last 24 tokens
    "one": {
        **PAPER_DESIGN, "content_read": "decoder", "content_read_keys": "end_distance", "output_decoder_input": True,
        "mlp_hidden_size": 1024, "output_decoder_drop_path": 0.5, "panm_dropout": 0.3, "reads_dropout": 0.0,
        "content_read_dropout": 0.3, "decoder_positions": "none", "decoder_window": 24,
    },
    # the translation and math examples' defaults before stop 60 (docs/results/transformer_integration.md, section
    # 12): every decoder layer kept, PANM's output dropped for half the training samples, the content read, `shift`
    "multi30k": {
        **PAPER_DESIGN, "placement": "stack", "panm_drop_path": 0.5, "content_read": "decoder",
        "pointer_update": "shift",
    },
    # the SCAN example's default before stop 60 (`panm_nope_cr_window` in examples/scan/run_table.py)
    "scan": {**PAPER_DESIGN, "content_read": "decoder", "decoder_positions": "none", "decoder_window": 24},
}  # fmt: skip
DEFAULT_DESIGN = "one"
DECODER_FLAGS = ("decoder_positions", "decoder_window")  # the designs' flags that change the backbone itself
# Flags that mean something only while another flag is on (PanmMemoryConfig raises otherwise): a run that turns that
# flag off and does not name them gets PanmMemoryConfig's defaults for them (`parse_with_defaults`).
DEPENDENT_FLAGS = {
    "content_read_keys": ("content_read", ("none", "controller"), "memory"),
    "content_read_dropout": ("content_read", ("none",), None),
    "output_decoder_drop_path": ("output_decoder_input", (False,), 0.0),
}


def named_design(argv: list[str], given: dict | None = None) -> str:
    """The `--panm_design` a command line (or a JSON file's keys, `given`) names, or DEFAULT_DESIGN."""
    name = DEFAULT_DESIGN if given is None else given.get("panm_design", DEFAULT_DESIGN)
    for index, token in enumerate(argv if given is None else ()):
        flag, _, value = token.partition("=")
        if flag in ("--panm_design", "--panm-design"):
            name = value or (argv[index + 1] if index + 1 < len(argv) else "")
    if name not in PANM_DESIGNS:
        raise ValueError(f"--panm_design must be one of {tuple(PANM_DESIGNS)} (got {name!r}).")
    return name


def parse_with_defaults(parser: HfArgumentParser, defaults: dict, argv: list[str], given: dict | None = None) -> tuple:
    """The parser's dataclasses from the command line `argv`, or from `given` (a JSON file's keys), over the example's
    `defaults` and the flags of the PANM design the run names (`--panm_design`, default "one"). What the run names
    wins; a design flag of DEPENDENT_FLAGS whose flag the run turns off (for example `--content_read none`) falls
    back to the library's default instead of raising; with `--model_name_or_path` or `--backbone t5` the design's
    DECODER_FLAGS do not apply unless named (the checkpoint's decoder, T5's relative positions are kept)."""
    design = named_design(argv, given)
    defaults = {**PANM_DESIGNS[design], **defaults, "panm_design": design}
    parser.set_defaults(**defaults)
    if given is None:
        values = vars(parser.parse_args(argv))
        named = {token[2:].split("=")[0].replace("-", "_") for token in argv if token.startswith("--")}
    else:
        values, named = {**defaults, **given}, set(given)  # parse_dict alone ignores set_defaults
    for name, (switch, off, fallback) in DEPENDENT_FLAGS.items():
        if name not in named and values.get(switch) in off:
            values[name] = fallback
    if values.get("model_name_or_path") is not None or values.get("backbone") == "t5":
        # a checkpoint keeps its decoder (a pretrained backbone its positions, a model the examples trained the
        # settings it records: `use_decoder_signal`), and T5 its relative positions, unless the run names the
        # decoder flags themselves
        values.update({name: PAPER_DESIGN[name] for name in DECODER_FLAGS if name not in named})
    return parser.parse_dict(values)


@dataclass
class ModelArguments:
    """Which models to train and how big they are; PANM's hyperparameters are `PanmMemoryConfig`'s flags."""

    model: str = field(default="both", metadata={"help": "transformer, panm or both (same budget)."})
    backbone: str = field(
        default="marian",
        metadata={"help": "marian (sinusoidal positions), bart (learned) or t5 (relative position buckets)."},
    )
    num_layers: int = field(default=2, metadata={"help": "Transformer encoder and decoder layers (paper: 1-3)."})
    d_model: int = field(default=256, metadata={"help": "Transformer hidden size."})
    ffn_dim: int = field(default=512, metadata={"help": "Transformer feed-forward size."})
    attention_heads: int = field(default=4, metadata={"help": "Attention heads per layer."})
    dropout: float = field(default=0.1)
    panm_design: str | None = field(
        default=None,
        metadata={
            "help": "The translation, math and SCAN examples: a named set of PANM and decoder flags "
            f"(PANM_DESIGNS: {', '.join(PANM_DESIGNS)}; default {DEFAULT_DESIGN}); flags given with it win."
        },
    )
    placement: str = field(
        default="residual",
        metadata={
            "help": "PANM placement: residual, replace (paper), stack or top (see PanmConfig); the translation, "
            "math and SCAN examples default to --panm_design one (replace), the bAbI example to residual."
        },
    )
    eos_decision: str = field(
        default="shared",
        metadata={
            "help": "Where PANM's model takes its end-of-sequence logit from: shared (what the LM head reads, as "
            "every token) or panm (PANM's output alone, so PANM decides when to stop; see PanmConfig)."
        },
    )
    input_feeding: bool = field(
        default=False,
        metadata={
            "help": "Feed the Controller's state h^c_{t-1} into PANM's decoder's input at step t (input feeding, "
            "beyond the paper; see PanmConfig). The decoder then runs one token at a time in training too."
        },
    )
    vocab_size: int = field(default=8000, metadata={"help": "Joint BPE vocabulary size of the local tokenizer."})
    panm_weight_decay: float | None = field(
        default=None,
        metadata={
            "help": "AdamW weight decay on PANM's weights only (biases and norms excepted); the backbone keeps "
            "--weight_decay. Default: --weight_decay for every weight, as Trainer does."
        },
    )
    weight_average_decay: float | None = field(
        default=None,
        metadata={
            "help": "Also evaluate an exponential moving average of the trainable weights, with this decay "
            "(e.g. 0.998: about the last 500 steps; panm_hf/pipelines/weight_average.py); its metrics are logged "
            "as eval_average_* (translation, SCAN). Training uses the weights themselves; the averaged model is "
            "saved beside the model, in <model folder>/weight_average. Default: no average."
        },
    )
    control: str | None = field(
        default=None,
        metadata={
            "help": "A training-time control for the PANM model (panm_hf/pipelines/controls.py): no_pointer_reads "
            "trains and tests it with its Mode-1 and Mode-2 values zeroed (Controller, content read and "
            "drop-path kept); no_reads zeroes the content read too; no_decoder_input zeroes z_t where the "
            "Controller takes it; no_controller_decoder_input zeroes it in the Controller GRU only."
        },
    )
    decoder_positions: str = field(
        default="absolute",
        metadata={
            "help": "The decoder's position signal, for both models (decoder_positions.py): absolute (the "
            "backbone's own); none (the decoder's absolute positions zeroed and frozen); offset (in training each "
            "sample's decoder positions start at a random offset in [0, --max_position_offset], at 0 in "
            "evaluation); alibi (none, and ALiBi's distance bias in the decoder's self-attention); relative (none, "
            "and a learned bias per head and distance inside --decoder_window, which it needs). All but "
            "absolute need a backbone with absolute positions (bart or marian)."
        },
    )
    max_position_offset: int = field(
        default=64, metadata={"help": "Largest random decoder position offset of --decoder_positions offset."}
    )
    decoder_window: int = field(
        default=0,
        metadata={
            "help": "A sliding window on the decoder's self-attention, for both models: each query attends to its "
            "last N tokens (0: all). Needs bart or marian."
        },
    )


def apply_smoke(smoke_overrides: dict, *parsed_args) -> None:
    """The smoke budget: settings that make one run take seconds on a CPU; flags given explicitly win.

    `parsed_args` are the parsed dataclasses in the order of `smoke_overrides` (model, panm, data, training).
    """
    for args, overrides in zip(parsed_args, smoke_overrides.values()):
        if isinstance(args, Seq2SeqTrainingArguments):
            default = Seq2SeqTrainingArguments(output_dir="unused", report_to=[])
        else:
            default = type(args)()
        for name, value in overrides.items():
            if getattr(args, name) == getattr(default, name):
                setattr(args, name, value)


def validate_model_args(model_args: ModelArguments, *, scores_weight_average: bool = False) -> None:
    """Check the model flags; ValueError naming the flag.

    `scores_weight_average`: the script reports the moving average's scores (translation's perplexity, SCAN's
    exact match); math and bAbI score generated answers from the weights alone, so they refuse
    `--weight_average_decay`.
    """
    if model_args.model not in (*MODELS, "both"):
        raise ValueError(f"--model must be one of {(*MODELS, 'both')} (got {model_args.model!r}).")
    if model_args.backbone not in BACKBONES:
        raise ValueError(f"--backbone must be one of {BACKBONES} (got {model_args.backbone!r}).")
    if not 1 <= model_args.num_layers:
        raise ValueError(f"--num_layers must be >= 1 (got {model_args.num_layers}).")
    drops_a_layer = model_args.placement in LAYER_REPLACING_PLACEMENTS
    if drops_a_layer and model_args.num_layers < 2 and model_args.model != "transformer":
        raise ValueError(
            f"--placement {model_args.placement} removes the last of --num_layers decoder layers, so it needs "
            "--num_layers >= 2; use --placement stack for a 1-layer backbone."
        )
    if model_args.panm_weight_decay is not None and not model_args.panm_weight_decay >= 0.0:
        raise ValueError(
            f"--panm_weight_decay must be >= 0 (got {model_args.panm_weight_decay}); omit it to use "
            "--weight_decay for PANM's weights too."
        )
    validate_weight_average_decay(model_args.weight_average_decay)
    if model_args.weight_average_decay is not None and not scores_weight_average:
        raise ValueError(
            "--weight_average_decay is scored by the translation and SCAN examples only; this example scores "
            "generated answers from the weights themselves. Omit the flag."
        )
    if model_args.panm_design is not None and model_args.panm_design not in PANM_DESIGNS:
        raise ValueError(f"--panm_design must be one of {tuple(PANM_DESIGNS)} (got {model_args.panm_design!r}).")
    validate_control(model_args.control)
    if model_args.decoder_positions not in DECODER_POSITIONS:
        raise ValueError(
            f"--decoder_positions must be one of {DECODER_POSITIONS} (got {model_args.decoder_positions!r})."
        )
    if model_args.decoder_positions != "absolute" and model_args.backbone == "t5":
        raise ValueError(
            f"--decoder_positions {model_args.decoder_positions} needs a decoder with absolute positions: use "
            "--backbone bart or marian, or --decoder_positions absolute with t5 (its positions are relative)."
        )
    if model_args.decoder_window < 0:
        raise ValueError(f"--decoder_window must be >= 0 (0: the whole prefix; got {model_args.decoder_window}).")
    if model_args.decoder_window and model_args.backbone == "t5":
        raise ValueError(
            "--decoder_window needs --backbone bart or marian (t5's attention takes its own bias); pass "
            "--decoder_window 0 with t5."
        )
    if not model_args.max_position_offset >= 0:
        raise ValueError(f"--max_position_offset must be >= 0 (got {model_args.max_position_offset}).")
    if model_args.control is not None and model_args.model == "transformer":
        raise ValueError("--control applies to the PANM model; use --model panm or both.")


def backbone_config(model_args: ModelArguments, tokenizer, max_positions: int):
    """A Marian-, BART- or T5-style encoder-decoder config built from the flags; `--decoder_positions offset`
    adds `--max_position_offset` positions to `max_positions`."""
    if model_args.decoder_positions == "offset":
        max_positions += model_args.max_position_offset
    if model_args.backbone == "t5":
        # T5: relative position buckets in every attention layer (the paper's "TRM + RPE" family), pre-LN.
        return T5Config(
            vocab_size=len(tokenizer), d_model=model_args.d_model,
            d_kv=model_args.d_model // model_args.attention_heads,
            d_ff=model_args.ffn_dim, num_layers=model_args.num_layers, num_decoder_layers=model_args.num_layers,
            num_heads=model_args.attention_heads, dropout_rate=model_args.dropout, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    common = dict(
        vocab_size=len(tokenizer), d_model=model_args.d_model, encoder_layers=model_args.num_layers,
        decoder_layers=model_args.num_layers, encoder_attention_heads=model_args.attention_heads,
        decoder_attention_heads=model_args.attention_heads, encoder_ffn_dim=model_args.ffn_dim,
        decoder_ffn_dim=model_args.ffn_dim, dropout=model_args.dropout, max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id, scale_embedding=True,
    )  # fmt: skip
    if model_args.backbone == "marian":
        # Marian: the original Transformer (sinusoidal positions, post-LN); decoding starts from <pad>.
        return MarianConfig(
            decoder_vocab_size=len(tokenizer), decoder_start_token_id=tokenizer.pad_token_id,
            share_encoder_decoder_embeddings=True, **common,
        )  # fmt: skip
    return BartConfig(decoder_start_token_id=tokenizer.eos_token_id, forced_eos_token_id=None, **common)


def decoder_flags(model_args: ModelArguments) -> dict:
    """`--decoder_positions`, `--decoder_window` and `--max_position_offset` under their config names."""
    return {"decoder_positions": model_args.decoder_positions, "decoder_window": model_args.decoder_window,
            "max_position_offset": model_args.max_position_offset}  # fmt: skip


def saved_decoder_signal(model: PreTrainedModel) -> dict:
    """The decoder settings a loaded checkpoint records: a PANM model's `PanmConfig` fields, else those its
    backbone's config records (`decoder_positions.record`, a Transformer the examples trained)."""
    saved = recorded(model.config)
    if saved == DEFAULTS and isinstance(model.config, PanmConfig):  # a backbone wrapped here: its own record
        saved = recorded(model.config.text_config)
    return saved


def use_decoder_signal(model: PreTrainedModel, model_args: ModelArguments) -> None:
    """Give a loaded model its decoder settings: the flags, or, where they are the defaults, those the checkpoint
    records (a model trained with them scores as trained). ValueError when both are set and differ."""
    flags, saved = decoder_flags(model_args), saved_decoder_signal(model)
    changed = ("decoder_positions", "decoder_window")
    if saved != DEFAULTS and flags != DEFAULTS and any(flags[key] != saved[key] for key in changed):
        raise ValueError(
            f"The checkpoint was trained with --decoder_positions {saved['decoder_positions']} --decoder_window "
            f"{saved['decoder_window']}, and the flags ask for --decoder_positions {flags['decoder_positions']} "
            f"--decoder_window {flags['decoder_window']}: omit both flags to keep the checkpoint's, or pass its values."
        )
    chosen = saved if flags == DEFAULTS else flags
    if isinstance(model, PanmForSeq2SeqLM):
        model.config.update(chosen)  # saved with the model, applied again when it is loaded
    else:
        record(model.config, **chosen)
    apply_decoder_positions(model, chosen["decoder_positions"], chosen["max_position_offset"],
                            chosen["decoder_window"])  # fmt: skip


def build_model(name: str, model_args: ModelArguments, panm_args: PanmMemoryConfig, config) -> PreTrainedModel:
    """Model `name` from a backbone config (random weights) or, when `config` is a path, from that checkpoint.

    The decoder settings (`--decoder_positions`, `--decoder_window`) go into the saved config: a PANM model's
    `PanmConfig` applies them when loaded, and the examples apply a plain model's record when they load it."""
    if isinstance(config, str):
        overrides = {"placement": model_args.placement, "eos_decision": model_args.eos_decision,
                     "input_feeding": model_args.input_feeding, **asdict(panm_args)}  # fmt: skip
        model = load_pretrained(name, config, overrides)
        if name == "panm":
            apply_control(model, model_args.control)
        use_decoder_signal(model, model_args)
        if saved_decoder_signal(model)["decoder_positions"] == "relative":  # a plain backbone's tables: dropped
            load_relative_bias(model, config)
        return model
    # Each model gets its own copy: Trainer sets `model.config.use_cache = False` for training, and
    # on a shared config that flag would reach the next model's generation config.
    config = copy.deepcopy(config)
    if name == "transformer":
        model = AutoModelForSeq2SeqLM.from_config(config)
        # Marian/BART take **kwargs, so Trainer would hand them num_items_in_batch and rescale their
        # (already token-averaged) loss; PanmForSeq2SeqLM opts out, and so does the baseline.
        model.accepts_loss_kwargs = False
        use_decoder_signal(model, model_args)
        return model
    panm_config = PanmConfig(
        text_config=config.to_dict(), placement=model_args.placement, eos_decision=model_args.eos_decision,
        input_feeding=model_args.input_feeding, **decoder_flags(model_args), **asdict(panm_args),
    )  # fmt: skip
    model = PanmForSeq2SeqLM(panm_config)  # applies the decoder settings
    apply_control(model, model_args.control)  # the hook stays with the model for training and testing
    return model


def parameter_checksum(model: torch.nn.Module) -> tuple[float, float]:
    """(sum of all parameters, sum over PANM's parameters): equal on every DDP rank iff they stay in sync."""
    total = sum(float(p.detach().double().sum()) for p in model.parameters())
    panm = sum(float(p.detach().double().sum()) for n, p in model.named_parameters() if n.startswith("panm."))
    return total, panm


def gather_checksums(model: torch.nn.Module) -> list[list[float]]:
    """Every rank's `parameter_checksum`, in rank order (a collective: call it on all ranks)."""
    return gather_from_ranks(list(parameter_checksum(model)))


class PanmSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose optimizer decays PANM's weights at their own rate (`--panm_weight_decay`), and
    which evaluates a moving average of the weights beside them (`--weight_average_decay`).

    Trainer's grouping is kept (biases and norms never decay; the backbone's weights decay at
    `args.weight_decay`); only the weights under `panm.` get `panm_weight_decay`. With `None` it is
    Trainer's optimizer exactly. With `weight_average_decay` every evaluation (not `predict`) also runs on
    the average (`weight_average.py`), its metrics named `<prefix>_average_<metric>`; training, `predict`
    and `save_model` use the weights themselves (the examples' `train` saves the average beside them).
    """

    def __init__(self, *args, panm_weight_decay: float | None = None, weight_average_decay: float | None = None,
                 **kwargs):  # fmt: skip
        super().__init__(*args, **kwargs)
        self.panm_weight_decay = panm_weight_decay
        self.weight_average_callback = None
        self._scoring_average = False  # within `weight_average_swapped_in`: evaluate once, on what the model holds
        if weight_average_decay is not None:
            self.weight_average_callback = WeightAverageCallback(weight_average_decay)
            self.add_callback(self.weight_average_callback)

    def _rng_devices(self) -> list:
        """The CUDA devices whose random state `fork_rng` saves (none on CPU)."""
        return list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []

    @property
    def weight_average(self):
        """The moving average of the weights (`WeightAverage`), or None: no `weight_average_decay`, no step yet."""
        return None if self.weight_average_callback is None else self.weight_average_callback.weight_average

    @contextmanager
    def weight_average_swapped_in(self):
        """Within the block the model holds the average and `evaluate` scores it once (a script's own scoring,
        e.g. SCAN's greedy exact match, runs on it too); the weights come back after."""
        if self.weight_average is None:
            raise ValueError("No weight average to score: pass --weight_average_decay and train first.")
        self._scoring_average = True
        try:
            with self.weight_average.swapped_in(self.model):
                yield self.model
        finally:
            self._scoring_average = False

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):  # fmt: skip
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        # no average yet, `predict` (the weights only), or the average already swapped in
        if self.weight_average is None or description != "Evaluation" or self._scoring_average:
            return output
        # the pass must not move the random streams training draws from (each DataLoader iterator draws a seed)
        with torch.random.fork_rng(devices=self._rng_devices()), self.weight_average.swapped_in(self.model):
            averaged = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                               f"{metric_key_prefix}_average")  # fmt: skip
        output.metrics.update(averaged.metrics)
        return output

    def create_optimizer(self, model=None):
        opt_model = self.model if model is None else model
        if self.optimizer is None and self.panm_weight_decay is not None:
            decay_names = set(self.get_decay_parameter_names(opt_model))
            groups = defaultdict(list)  # weight decay -> parameters
            for name, parameter in opt_model.named_parameters():
                if not parameter.requires_grad:
                    continue
                if name not in decay_names:
                    groups[0.0].append(parameter)
                elif name.startswith("panm."):
                    groups[self.panm_weight_decay].append(parameter)
                else:
                    groups[self.args.weight_decay].append(parameter)
            if self.optimizer_cls_and_kwargs is not None:
                optimizer_cls, optimizer_kwargs = self.optimizer_cls_and_kwargs
            else:
                optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            if any(key in optimizer_kwargs for key in ("params", "model", "optimizer_dict")):
                # GaLore, LOMO and layer-wise optimizers build their own parameter groups.
                raise ValueError(
                    f"--panm_weight_decay needs an optimizer that takes parameter groups; --optim "
                    f"{self.args.optim} builds its own. Drop --panm_weight_decay or use --optim adamw_torch."
                )
            self.optimizer = optimizer_cls(
                [{"params": params, "weight_decay": rate} for rate, params in groups.items()], **optimizer_kwargs
            )
        return super().create_optimizer(model)


def model_trainer(
    name, model, tokenizer, training_args, train_dataset, eval_dataset=None, *, generate: bool,
    panm_weight_decay: float | None = None, weight_average_decay: float | None = None,
):  # fmt: skip
    """The examples' `Seq2SeqTrainer` for one model: output in `<output_dir>/<name>`, labels padded with -100.

    `generate` sets `predict_with_generate` (translation evaluates loss per epoch; math and bAbI score
    generated answers); `panm_weight_decay` is `--panm_weight_decay` (see `PanmSeq2SeqTrainer`).
    """
    output_dir = os.path.join(training_args.output_dir, name)
    args = Seq2SeqTrainingArguments(**{**training_args.to_dict(), "output_dir": output_dir})
    args.predict_with_generate = generate
    return PanmSeq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        processing_class=tokenizer,
        panm_weight_decay=panm_weight_decay,
        weight_average_decay=weight_average_decay,
    )
