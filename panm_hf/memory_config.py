"""PanmMemoryConfig: PANM's hyperparameters, their defaults, allowed values and checks, in one place.

A plain dataclass that imports only the standard library (as PEFT's `LoraConfig`):
`PanmConfig` inherits these fields, `PanmMemory` and its parts read them
(`PanmMemory(config, ...)`, as transformers' layers take `config`), and example scripts
expose every field with `HfArgumentParser(PanmMemoryConfig)`. A new option is a field
here plus the module that uses it.

Paper symbols: Le et al., "Plug, Play, and Generalize: Length Extrapolation with
Pointer-Augmented Neural Memory", Sec. 2 and appendix; defaults are the paper's.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field

SCORINGS = ("dot", "cosine")
CONTROLLER_INITS = ("mean", "sum")
# The Controller's recurrent cell: the paper's GRU, or an LSTM (beyond the paper: its additive cell state can count
# steps without saturating, Weiss et al. 2018); an LSTM carries `[h, c]` as its state.
CONTROLLER_CELLS = ("gru", "lstm")
POINTER_UPDATES = ("attention", "shift")
SHIFT_INITS = ("uniform", "walk")
CONTENT_READS = ("none", "decoder", "controller")
# The decoder content read's keys: the memory slots (`"memory"`), the slots plus a learned code of their distance
# from the last real slot (`"end_distance"`: the `p_E`-relative address, the same at every input length), or that
# code alone (`"end_distance_only"`: a read by place, its values still the slots).
CONTENT_READ_KEYS = ("memory", "end_distance", "end_distance_only")
DROP_SCOPES = ("sample", "step")
ADDRESS_KEYS = ("mlp", "linear")
RECURRENCE_KERNELS = ("auto", "eager", "fused", "triton")
# Why a setting has no fused kernel; `panm_hf.kernels.dispatch` gives the same reason at run time.
CONTROLLER_READ_STEPS = (
    'content_read="controller" reads with the Controller state, so the Controller steps one at a time'
)
INTEGER_FIELDS = (
    "address_bits", "num_pointer_units", "num_mode2_heads", "pointer_hidden_size", "controller_hidden_size",
    "mlp_hidden_size", "shift_range", "address_distractors", "controller_truncation",
)  # fmt: skip


@dataclass
class PanmMemoryConfig:
    r"""Hyperparameters of Pointer-Augmented Neural Memory (the backbone-agnostic core).

    Args:
        address_bits (`int`, *optional*, defaults to 10):
            `b`, bits of a physical address; inputs may have at most `2^b` tokens.
        num_pointer_units (`int`, *optional*, defaults to 2):
            `H^a`, Mode-1 pointers, each with its own Pointer Unit. They start at the base
            address `p_B`, the end address `p_E`, then evenly spaced slots (the middle for 3).
        num_mode2_heads (`int`, *optional*, defaults to 1):
            `H^c`, Mode-2 attention heads (0 disables Mode 2).
        pointer_hidden_size (`int`, *optional*, defaults to 256):
            size of each Pointer Unit GRU state `h^a_t`.
        controller_hidden_size (`int`, *optional*, defaults to 256):
            size of the Controller GRU state `h^c_t`.
        mlp_hidden_size (`int`, *optional*, defaults to 128):
            hidden width of the MLPs `g^a`, `g^c` and `g^o`.
        scoring (`str`, *optional*, defaults to `"cosine"`):
            attention scoring of the address attention (Eq. 2) and Mode-2 attention (Eq. 5):
            `"cosine"` (the paper's equations, times a learnable inverse temperature) or `"dot"`
            (scaled dot product, the authors' code); compared in docs/results/design_choices.md.
        cosine_inverse_temperature (`float`, *optional*, defaults to 15.0):
            initial inverse temperature for `scoring="cosine"`.
        address_key (`str`, *optional*, defaults to `"mlp"`):
            `g^a`, the map from an address code to its key in the address attention (Eq. 2): `"mlp"`
            (the paper's text, one hidden layer of `mlp_hidden_size`) or `"linear"` (the authors' code,
            an affine map of the bits, so with `scoring="dot"` a score is linear in each bit); compared in
            docs/results/design_choices.md.
        controller_cell (`str`, *optional*, defaults to `"gru"`):
            the Controller's recurrence: `"gru"` (the paper) or `"lstm"` (beyond the paper: an LSTM, whose
            additive cell state can hold a count past the lengths seen in training, Weiss et al. 2018). The LSTM's
            state `h^c_t` is `[h, c]`, twice `controller_hidden_size` wide, `c_0 = 0`; it runs as `nn.LSTM`
            (no fused kernel: `recurrence_kernel` "auto" or "eager"), with `content_read` "none" or "decoder".
        controller_truncation (`int`, *optional*, defaults to 0):
            beyond the paper: in training, truncated backpropagation through the Controller's recurrence. Its
            state enters every `controller_truncation`-th step detached (the first cut at a step drawn from 1 to
            K per call, so the cuts move from batch to batch): no gradient asks the state to carry anything
            further than K steps. The forward pass and eval are unchanged. Meant to make a count restart within
            K steps (a clause's, not the whole output's); on SCAN it did not: the forward pass still carries the
            count across the cuts (docs/results/scan_count.md point 31). 0 (the default) backpropagates through
            every step.
        controller_reset_rate (`float`, *optional*, defaults to 0.0):
            beyond the paper: in training, the probability that a sample's Controller state is set back to the
            state it entered the call with (`h^c_0` under teacher forcing) at one step, drawn from 1 to steps - 1
            per call; forward pass and gradient alike. The steps after the reset must then be written without the
            Controller's memory of the steps before it, so that its state cannot be the output's only count. No
            effect in eval. 0 disables it. On SCAN at 0.5 the stop left the Controller's count, and the stop that
            replaced it fired where training's outputs end (docs/results/scan_count.md point 32).
        controller_init (`str`, *optional*, defaults to `"mean"`):
            `h^c_0` from a projected `"mean"` of the real memory slots, or the paper's `"sum"`.
        pointer_update (`str`, *optional*, defaults to `"attention"`):
            how a Pointer Unit moves its pointer. `"attention"` is the paper's Eq. 2. `"shift"` (beyond
            the paper) adds content-free pointer arithmetic: each unit picks, by one softmax, among
            moving its previous address attention by a step in `-K..K` and the paper's attention; the
            mixture is sharpened by a learned exponent (`panm_hf.pointer_arithmetic`); results in
            docs/results/beyond_paper.md.
        shift_range (`int`, *optional*, defaults to 1):
            `K`, the largest step of `pointer_update="shift"`.
        shift_init (`str`, *optional*, defaults to `"uniform"`):
            the moves' starting preference under `pointer_update="shift"`: `"uniform"` over the steps, or
            `"walk"` (beyond the paper), where the base pointer starts preferring `+1` and the end pointer
            `-1` (logit bias 2, about 0.76 of the weight), so the pointers start by walking the memory
            from its two ends and training keeps or changes that; results in docs/results/causal_lm.md.
        address_distractors (`int`, *optional*, defaults to 0):
            beyond the paper: in training, this many distractor addresses per sample (a real address
            plus a multiple of the smallest power of two covering the input) join the address bank the
            Pointer Units attend over; weight put on them reads nothing. 0 disables; no effect in eval.
        content_read (`str`, *optional*, defaults to `"none"`):
            `"none"` keeps the paper's reads; `"decoder"` (beyond the paper's equations, after the
            authors' code, which has an attention over `M` inside the Controller) adds a content
            attention over `M` queried by the decoder state `z_t`, fed to the Controller with the
            Mode-1/Mode-2 values. Needs a decoder input (seq2seq; the QA head has no `z_t`).
            `"controller"` is the authors' code itself: a Bahdanau attention over `M` queried by the
            Controller's previous state `h^c_{t-1}`, its value fed to the Controller GRU and `g^o`, so the
            read follows what has been decoded even with `z_t = 0`; the Controller then runs its steps one
            at a time (no fused kernel); results in docs/results/controller_read.md.
        content_read_keys (`str`, *optional*, defaults to `"memory"`):
            beyond the paper, with `content_read="decoder"`: the content read's keys. `"memory"`: the slots `M`.
            `"end_distance"`: each slot's key is `M[j]` plus a learned projection of the binary code of its distance
            from the last real slot, `p_E - j` in addresses (content-free, and unlike the address `p_B + j` the same
            in training and at test), so `z_t` can ask for "the k-th slot from the end" at any input length (e.g.
            a digit's place in a number that ends the question). `"end_distance_only"`: the key is that projection
            alone, so the read selects slots by their place from the end and not by their content. The values read
            are `M`'s. Seq2seq memories only (one memory per sample, not a causal per-step mask).
        output_decoder_input (`bool`, *optional*, defaults to `False`):
            beyond the paper: the output MLP `g^o` also reads the decoder state `z_t` (the paper's `g^o` reads the
            Mode-1/Mode-2 values and `h^c_t`; `z_t` reaches the output only through the Controller GRU). With
            `placement="replace"` this gives the decoder's state a path to the logits that does not pass the GRU.
            With `PanmConfig.eos_decision="panm"` the end-of-sequence logit leaves that path out (`g^o` without its
            `z_t` columns). Needs a decoder input (seq2seq, decoder-only; not the QA head).
        output_decoder_drop_path (`float`, *optional*, defaults to 0.0):
            beyond the paper, with `output_decoder_input`: in training, the probability that a sample's `g^o` gets
            no `z_t` at any step (its `z_t` columns' input set to zero; kept ones scaled by `1 / (1 - p)`), so that
            the reads and `h^c_t` learn to produce the output without the decoder's state beside them; no effect
            in eval. 0 disables it.
        output_decoder_drop_scope (`str`, *optional*, defaults to `"sample"`):
            what `output_decoder_drop_path` drops at once: `"sample"`, a sample's `z_t` at every step or at none;
            `"step"`, each (sample, step)'s `z_t` on its own (what the input-feeding path did until 56a8b1e, which
            gave the 94.1 of docs/results/scan_count.md point 27).
        panm_dropout (`float`, *optional*, defaults to 0.0):
            dropout on the reads entering the Controller and on its output (the paper has none; the
            authors' code drops 0.5 of the Mode-2 attention).
        reads_dropout (`float`, *optional*):
            beyond the paper: dropout on the reads alone; `None` (the default) takes `panm_dropout`, as
            `classifier_dropout` falls back in transformers' configs. `reads_dropout=0` with `panm_dropout > 0`
            drops PANM's output only.
        content_read_dropout (`float`, *optional*):
            beyond the paper, with `content_read="decoder"` or `"controller"`: dropout on the content read's value
            alone; `None` (the default) takes the reads' rate. With `reads_dropout=0` it regularises the read that
            acts as cross-attention and leaves the pointer reads (Mode 1, Mode 2) whole.
        mlp_dropout (`float`, *optional*, defaults to 0.0):
            beyond the paper: dropout on `g^o`'s hidden layer (its `mlp_hidden_size` units, after the ReLU), as a
            Transformer's FFN drops its activations; regularises a wide `g^o` without dropping the reads.
        panm_drop_path (`float`, *optional*, defaults to 0.0):
            beyond the paper: in training, the probability that a sample's whole PANM output is dropped
            (set to zero; kept outputs are scaled by `1 / (1 - p)`), stochastic depth on PANM's branch.
            Meant for `placement="stack"`/`"residual"`, where the backbone's own path then has to stay
            good alone instead of co-adapting with PANM (`PanmConfig` refuses it with `"replace"`);
            no effect in eval. 0 disables it. 0.5 with `"stack"` is the translation and math examples' default.
        recurrence_kernel (`str`, *optional*, defaults to `"auto"`):
            how PANM's two recurrences, the Pointer-Unit loop and the Controller GRU, run (speed only; the
            results agree to rounding). `"eager"`: one step at a time in PyTorch ops and `nn.GRU` (the
            reference). `"fused"`: each recurrence's steps in one compiled kernel and its backward in
            another (`panm_hf.kernels`; either `pointer_update`); only with a (batch, slots) mask, in
            float32/float64, on CPU (a C kernel; needs a C compiler) or on CUDA (the Pointer Units' Triton
            port; the Controller keeps cuDNN's GRU);
            anything else raises a ValueError saying why. `"auto"`: fused where it applies (CPU with a C
            compiler; CUDA with Triton), eager elsewhere (causal decoding's per-step masks, half precision,
            no compiler or no Triton). `"triton"`: the code path CUDA takes, on any device: the
            Pointer-Unit loop and the Controller GRU in their Triton ports (on CPU only under Triton's
            interpreter, `TRITON_INTERPRET=1` set before triton is imported; CUDA's `"auto"` keeps cuDNN's GRU,
            one op each way as the port is one launch), the rest in plain torch ops; raises where `"fused"`
            would, and when Triton is missing.
            Outside the loops, `"auto"` and `"fused"` also run cosine normalisation, the Mode-2 and decoder
            content reads and `h^c_0`'s pooling as C kernels on CPU (float32/float64; plain torch elsewhere);
            `"eager"` keeps them all in plain torch ops. `panm_hf.kernels.dispatch` decides each op's path and says why.
    """

    address_bits: int = field(default=10, metadata={"help": "PANM b: inputs may have at most 2^b tokens."})
    num_pointer_units: int = field(default=2, metadata={"help": "PANM H^a: Mode-1 pointers (Pointer Units)."})
    num_mode2_heads: int = field(default=1, metadata={"help": "PANM H^c: Mode-2 heads (0 disables Mode 2)."})
    pointer_hidden_size: int = field(default=256, metadata={"help": "PANM h^a_t: Pointer Unit GRU size."})
    controller_hidden_size: int = field(default=256, metadata={"help": "PANM h^c_t: Controller GRU size."})
    mlp_hidden_size: int = field(default=128, metadata={"help": "PANM g^a, g^c, g^o: hidden width of the MLPs."})
    scoring: str = field(
        default="cosine",
        metadata={"help": "PANM attention scoring of Eqs. 2 and 5: cosine (paper) or dot.", "choices": SCORINGS},
    )
    cosine_inverse_temperature: float = field(
        default=15.0, metadata={"help": "PANM: initial (learned) inverse temperature of cosine scoring."}
    )
    address_key: str = field(
        default="mlp",
        metadata={
            "help": "PANM g^a, address code -> key: mlp (the paper's text) or linear (the authors' code).",
            "choices": ADDRESS_KEYS,
        },
    )
    controller_cell: str = field(
        default="gru",
        metadata={"help": "PANM Controller recurrence: gru (the paper) or lstm (beyond the paper).",
                  "choices": CONTROLLER_CELLS},
    )
    controller_truncation: int = field(
        default=0,
        metadata={"help": "PANM, beyond the paper: truncated backpropagation through the Controller every K "
                  "training steps (0: off)."},
    )
    controller_reset_rate: float = field(
        default=0.0,
        metadata={"help": "PANM, beyond the paper: in training, the probability that a sample's Controller state is "
                  "reset to its initial state at one step drawn per batch (0: off)."},
    )
    controller_init: str = field(
        default="mean",
        metadata={"help": "PANM h^c_0 from the mean or the paper's sum of M.", "choices": CONTROLLER_INITS},
    )
    pointer_update: str = field(
        default="attention",
        metadata={
            "help": "PANM Pointer Unit: attention (the paper's Eq. 2) or shift (beyond the paper: pointer arithmetic).",
            "choices": POINTER_UPDATES,
        },
    )
    shift_range: int = field(default=1, metadata={"help": "PANM K: the largest step of pointer_update=shift."})
    shift_init: str = field(
        default="uniform",
        metadata={
            "help": "PANM, pointer_update=shift: the moves start uniform, or walk (base pointer +1, end pointer -1).",
            "choices": SHIFT_INITS,
        },
    )
    address_distractors: int = field(
        default=0, metadata={"help": "PANM, beyond the paper: distractor addresses per sample in training (0: off)."}
    )
    content_read: str = field(
        default="none",
        metadata={
            "help": "PANM content read: none (the paper), decoder (attention over M queried by z_t) or "
            "controller (queried by the Controller state, as in the authors' code).",
            "choices": CONTENT_READS,
        },
    )
    content_read_keys: str = field(
        default="memory",
        metadata={
            "help": "PANM, with content_read decoder: the content read's keys, the memory (memory) or the memory "
            "plus a code of each slot's distance from the last real slot (end_distance), or that code alone "
            "(end_distance_only).",
            "choices": CONTENT_READ_KEYS,
        },
    )
    output_decoder_input: bool = field(
        default=False, metadata={"help": "PANM, beyond the paper: g^o also reads the decoder state z_t."}
    )
    output_decoder_drop_path: float = field(
        default=0.0,
        metadata={"help": "PANM, with output_decoder_input: training probability that a sample's g^o gets no z_t."},
    )
    output_decoder_drop_scope: str = field(
        default="sample",
        metadata={
            "help": "PANM, with output_decoder_drop_path: drop a sample's z_t at every step at once (sample) or each "
            "step's on its own (step).",
            "choices": DROP_SCOPES,
        },
    )
    panm_dropout: float = field(default=0.0, metadata={"help": "Dropout on PANM's reads and output (paper: 0)."})
    reads_dropout: float | None = field(
        default=None, metadata={"help": "PANM, beyond the paper: dropout on the reads alone (default: panm_dropout)."}
    )
    content_read_dropout: float | None = field(
        default=None,
        metadata={"help": "PANM, beyond the paper: dropout on the content read alone (default: the reads' rate)."},
    )
    mlp_dropout: float = field(
        default=0.0, metadata={"help": "PANM, beyond the paper: dropout on g^o's hidden layer (0: off)."}
    )
    panm_drop_path: float = field(
        default=0.0, metadata={"help": "Training: probability of dropping a sample's whole PANM output (0: off)."}
    )
    recurrence_kernel: str = field(
        default="auto",
        metadata={
            "help": "PANM Pointer-Unit loop and Controller GRU: eager (ops per step), fused (one kernel), auto, or "
            "triton (the CUDA path on any device).",
            "choices": RECURRENCE_KERNELS,
        },
    )

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the field and the fix when a hyperparameter is out of range (the tables above)."""
        for name in INTEGER_FIELDS:  # a bool is an int to Python: True would silently count as 1
            value = getattr(self, name)
            if isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, not the bool {value!r}; pass a number such as 1.")
        temperature = self.cosine_inverse_temperature
        if not _is_number(temperature) or not math.isfinite(temperature) or temperature <= 0:
            raise ValueError(
                f"cosine_inverse_temperature must be a finite number > 0 (got {temperature!r}); "
                "it scales cosine scores, the default is 15.0."
            )
        for name, minimum, label, fix in INTEGER_RANGES:
            value = getattr(self, name)
            if not isinstance(value, int) or value < minimum:
                rule = "a positive integer" if label is None else f"an integer >= {minimum}"
                raise ValueError(f"{label or name} must be {rule} (got {value!r}){fix}.")
            if name == "address_bits" and value > 62:
                raise ValueError(f"address_bits={value} overflows 64-bit addresses; use at most 62.")
        for name, (choices, hint) in CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported; choose one of {choices}{hint}.")
        if not isinstance(self.output_decoder_input, bool):
            raise ValueError(
                f"output_decoder_input must be True or False (got {self.output_decoder_input!r})."
            )
        for name in PROBABILITIES:
            value = getattr(self, name)
            if name in OPTIONAL_PROBABILITIES and value is None:
                continue
            if not _is_number(value) or not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1) (got {value!r}); 0 disables it.")
        for conflict, message in CONFLICTS:
            if conflict(self):
                raise ValueError(message(self))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# (field, minimum, how the message names it (None: "a positive integer"), the fix appended to the message)
INTEGER_RANGES = (
    ("address_bits", 1, "address_bits", ""),
    ("num_pointer_units", 1, "num_pointer_units (H^a)", "; the paper uses 2 (base and end pointers)"),
    ("num_mode2_heads", 0, "num_mode2_heads (H^c)", ""),
    ("pointer_hidden_size", 1, None, ""),
    ("controller_hidden_size", 1, None, ""),
    ("mlp_hidden_size", 1, None, ""),
    ("shift_range", 1, "shift_range", "; 1 allows steps -1, 0, +1"),
    ("address_distractors", 0, "address_distractors", "; 0 disables"),
    ("controller_truncation", 0, "controller_truncation", "; 0 disables"),
)
# field -> (allowed values, a hint appended to the message)
CHOICES = {
    "scoring": (SCORINGS, ""),
    "address_key": (ADDRESS_KEYS, ' ("mlp" is the paper\'s g^a, "linear" the authors\' code)'),
    "controller_init": (CONTROLLER_INITS, ""),
    "controller_cell": (CONTROLLER_CELLS, ' ("gru" is the paper\'s Controller)'),
    "pointer_update": (POINTER_UPDATES, ' ("attention" is the paper\'s Pointer Unit)'),
    "shift_init": (SHIFT_INITS, ' ("uniform" starts with no preferred step)'),
    "content_read": (CONTENT_READS, ' ("none" is the paper\'s equations)'),
    "content_read_keys": (CONTENT_READ_KEYS, ' ("memory": the slots alone)'),
    "output_decoder_drop_scope": (DROP_SCOPES, ' ("sample": all of a sample\'s steps at once)'),
    "recurrence_kernel": (RECURRENCE_KERNELS, ' ("auto" fuses the Pointer-Unit loop where it can)'),
}
PROBABILITIES = (
    "panm_dropout", "panm_drop_path", "output_decoder_drop_path", "mlp_dropout", "reads_dropout",
    "content_read_dropout", "controller_reset_rate",
)  # fmt: skip
OPTIONAL_PROBABILITIES = ("reads_dropout", "content_read_dropout")  # None: falls back to another field


def reads_dropout_rate(config) -> float:
    """The reads' dropout: `reads_dropout`, or `panm_dropout` where it is None."""
    return config.panm_dropout if config.reads_dropout is None else config.reads_dropout


def content_read_dropout_rate(config) -> float:
    """The content read's dropout: `content_read_dropout`, or the reads' rate where it is None."""
    return reads_dropout_rate(config) if config.content_read_dropout is None else config.content_read_dropout
FORCED_KERNELS = ("fused", "triton")  # settings that raise rather than fall back to the eager loops
# (when the fields conflict, the message naming them and the fix)
CONFLICTS = (
    (
        lambda c: c.recurrence_kernel in FORCED_KERNELS and c.content_read == "controller",
        lambda c: f'recurrence_kernel="{c.recurrence_kernel}" cannot run content_read="controller": '
        f'{CONTROLLER_READ_STEPS}; use recurrence_kernel="auto" or "eager".',
    ),
    (
        lambda c: c.controller_cell == "lstm" and c.recurrence_kernel in FORCED_KERNELS,
        lambda c: f'recurrence_kernel="{c.recurrence_kernel}" fuses the Controller GRU, and controller_cell is '
        '"lstm" (run by nn.LSTM); use recurrence_kernel="auto" or "eager", or controller_cell="gru".',
    ),
    (
        lambda c: c.controller_cell == "lstm" and c.content_read == "controller",
        lambda c: 'content_read="controller" steps the Controller GRU itself, and controller_cell is "lstm"; set '
        'content_read="decoder" or "none", or controller_cell="gru".',
    ),
    (
        lambda c: c.recurrence_kernel == "triton" and importlib.util.find_spec("triton") is None,
        lambda c: 'recurrence_kernel="triton" needs Triton, which is not installed: `pip install triton`, or use '
        'recurrence_kernel="auto" or "eager".',
    ),
    (
        lambda c: c.shift_init != "uniform" and c.pointer_update != "shift",
        lambda c: f'shift_init={c.shift_init!r} sets the starting moves of pointer_update="shift" and does nothing '
        f'with pointer_update={c.pointer_update!r}; set pointer_update="shift" or shift_init="uniform".',
    ),
    (
        lambda c: c.output_decoder_drop_path > 0 and not c.output_decoder_input,
        lambda c: f"output_decoder_drop_path={c.output_decoder_drop_path} drops the decoder state z_t that g^o reads "
        "under output_decoder_input, which is False; set output_decoder_input=True or output_decoder_drop_path=0.",
    ),
    (
        lambda c: c.output_decoder_drop_scope != "sample" and c.output_decoder_drop_path == 0,
        lambda c: f"output_decoder_drop_scope={c.output_decoder_drop_scope!r} sets what output_decoder_drop_path "
        'drops at once, and output_decoder_drop_path is 0; set output_decoder_drop_path > 0 or '
        'output_decoder_drop_scope="sample".',
    ),
    (
        lambda c: c.content_read_keys != "memory" and c.content_read != "decoder",
        lambda c: f"content_read_keys={c.content_read_keys!r} keys the decoder content read, and content_read is "
        f'{c.content_read!r}; set content_read="decoder" or content_read_keys="memory".',
    ),
    (
        lambda c: c.content_read_dropout is not None and c.content_read == "none",
        lambda c: f"content_read_dropout={c.content_read_dropout} drops the content read, and content_read is "
        '"none"; set content_read="decoder" or "controller", or content_read_dropout=None.',
    ),
    (
        lambda c: c.pointer_update == "shift" and c.address_distractors > 0,
        lambda c: 'pointer_update="shift" moves pointers over consecutive slots and cannot be combined with '
        'address_distractors; set address_distractors=0 or pointer_update="attention".',
    ),
)

__all__ = [
    "ADDRESS_KEYS", "CONTENT_READS", "CONTROLLER_CELLS", "CONTROLLER_INITS", "RECURRENCE_KERNELS", "POINTER_UPDATES",
    "SCORINGS", "SHIFT_INITS",
    "PanmMemoryConfig",
]  # fmt: skip
