"""panm_hf: Pointer-Augmented Neural Memory for HuggingFace Transformers.

Importing the package registers `PanmConfig` with `AutoConfig` and the PANM models
with their Auto classes.
"""

from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForQuestionAnswering, AutoModelForSeq2SeqLM

from .adapter import PanmAdapterConfig
from .addressing import binary_codes, build_address_bank, sample_base_address
from .cache_panm import PanmCache, PanmDynamicCache
from .configuration_panm import PanmConfig
from .memory import PanmMemory, PanmMemoryOutput
from .memory_config import PanmMemoryConfig
from .modeling_panm import PanmForSeq2SeqLM, PanmPreTrainedModel, PanmSeq2SeqLMOutput
from .modeling_panm_causal import PanmCausalLMOutputWithPast, PanmForCausalLM
from .modeling_panm_qa import BertWithPanmForQA, BertWithPanmForQuestionAnswering
from .state import AddressedMemory, PanmState

__version__ = "0.1.0"

AutoConfig.register("panm", PanmConfig, exist_ok=True)
AutoModelForSeq2SeqLM.register(PanmConfig, PanmForSeq2SeqLM, exist_ok=True)
PanmConfig.register_for_auto_class()
PanmForSeq2SeqLM.register_for_auto_class("AutoModelForSeq2SeqLM")
AutoModelForQuestionAnswering.register(PanmConfig, BertWithPanmForQuestionAnswering, exist_ok=True)
BertWithPanmForQuestionAnswering.register_for_auto_class("AutoModelForQuestionAnswering")
AutoModelForCausalLM.register(PanmConfig, PanmForCausalLM, exist_ok=True)
PanmForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "AddressedMemory",
    "BertWithPanmForQA",
    "BertWithPanmForQuestionAnswering",
    "PanmAdapterConfig",
    "PanmCache",
    "PanmCausalLMOutputWithPast",
    "PanmConfig",
    "PanmDynamicCache",
    "PanmForCausalLM",
    "PanmForSeq2SeqLM",
    "PanmMemory",
    "PanmMemoryConfig",
    "PanmMemoryOutput",
    "PanmPreTrainedModel",
    "PanmSeq2SeqLMOutput",
    "PanmState",
    "binary_codes",
    "build_address_bank",
    "sample_base_address",
]
