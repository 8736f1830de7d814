"""BertWithPanmForQuestionAnswering: PANM's Controller as an extractive-QA span head.

Design (paper, Sec. 4.3 "Question Answering" and appendix: "PANM appends the
Controller to BERT to predict the start and end"):

* Memory ``M`` = the encoder's last hidden states ``(batch, slots, hidden)``. Padding
  slots are no part of the memory: the attention mask masks them in the Pointer Units'
  address attention, in the Mode-2 attention and in the Controller's initial state
  ``h^c_0`` (a mean over the real slots only).
* The Controller runs two decoding steps over ``M`` with no decoder input
  (``z_t = 0``). The output ``o_t`` of step 1 is a query scored against every slot as
  the answer start, the output of step 2 as the answer end:
  ``pointer_logits[t, i] = o_t . M[i] / sqrt(hidden)``. The Controller's output MLP
  ``g^o`` is already a learned projection of the query, so the keys are ``M`` itself
  (a bilinear score needs no second projection).
* The standard span head ``qa_outputs`` (a ``Linear(hidden, 2)`` as in
  ``BertForQuestionAnswering``) stays as a residual path and the two are summed:
  ``start = qa_outputs(M)[..., 0] + pointer_logits[:, 0]``, likewise for the end. The
  last layer of ``g^o`` is zero-initialised, so at step 0 the queries are exactly zero
  and a freshly wrapped fine-tuned QA checkpoint reproduces its own logits bit for bit;
  PANM's contribution is learned from there (the gradient reaching ``g^o``'s last
  layer is not zero, since it is ``M`` times the loss gradient).
* After the sum, padded positions get the dtype's minimum, so no start/end probability
  lands on padding. Question tokens keep their logits, as in the standard head; answer
  post-processing excludes them (as transformers' run_qa example does).
* Loss exactly as ``BertForQuestionAnswering``: positions clamped to the sequence length,
  cross-entropy with ``ignore_index=seq_len``, mean of the start and end losses.

Any encoder ``AutoModel`` can be the backbone (BERT is the documented default; RoBERTa,
MiniLM, ELECTRA, ... work the same way). The class is also exported as
``BertWithPanmForQA``; its full name contains ``QuestionAnswering`` because Trainer
recognises QA models by class name.
"""

from __future__ import annotations

import inspect
import math
import os

import torch
from einops import rearrange
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForQuestionAnswering, PreTrainedModel
from transformers.modeling_outputs import QuestionAnsweringModelOutput
from transformers.models.auto.modeling_auto import MODEL_MAPPING

from .backbones import check_encoder_backbone
from .configuration_panm import PanmConfig
from .memory import PanmMemory
from .modeling_panm import PanmPreTrainedModel

NUM_SPAN_STEPS = 2  # step 1 points at the answer start, step 2 at the answer end


def _encoder_kwargs(config) -> dict:
    """`add_pooling_layer=False` where the encoder class takes it (BERT, RoBERTa): the pooler is unused."""
    model_class = MODEL_MAPPING.get(type(config), None)
    if model_class is not None and "add_pooling_layer" in inspect.signature(model_class.__init__).parameters:
        return {"add_pooling_layer": False}
    return {}


def _is_qa_checkpoint(config) -> bool:
    return any(name.endswith("ForQuestionAnswering") for name in (getattr(config, "architectures", None) or []))


class BertWithPanmForQuestionAnswering(PanmPreTrainedModel):
    """An encoder (BERT by default) with PANM's Controller pointing at the answer span.

    Args:
        config: a `PanmConfig` whose `text_config` is an encoder-only backbone config
            (e.g. `BertConfig`); `placement` is not used by this model.
        backbone: an already built encoder (used by `from_backbone`); built from
            `config.text_config` when None.
    """

    def __init__(self, config: PanmConfig, backbone: PreTrainedModel | None = None):
        super().__init__(config)
        text_config = config.text_config
        if getattr(text_config, "is_encoder_decoder", False):
            raise ValueError(
                f"text_config must be an encoder-only backbone (e.g. BertConfig) for BertWithPanmForQuestionAnswering; "
                f"got the encoder-decoder model_type={text_config.model_type!r} (use PanmForSeq2SeqLM for it)."
            )
        if backbone is None:
            backbone = AutoModel.from_config(text_config, **_encoder_kwargs(text_config))
        self.backbone = backbone
        hidden_size = text_config.hidden_size
        self.qa_outputs = nn.Linear(hidden_size, 2)
        self.panm = PanmMemory(config, memory_dim=hidden_size, decoder_input_size=0, output_size=hidden_size)
        self.post_init()

    def _zero_init_module(self) -> nn.Module | None:
        # g^o's last layer: zero queries at init, so the pointer logits start at exactly 0.
        return self.panm.controller.output_mlp[-1]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if module is self.qa_outputs:
            # As BertForQuestionAnswering initialises its span head.
            nn.init.normal_(module.weight, mean=0.0, std=getattr(self.config.text_config, "initializer_range", 0.02))
            nn.init.zeros_(module.bias)
            return
        super()._init_weights(module)

    @classmethod
    def _check_backbone(cls, backbone: PreTrainedModel) -> None:
        """An encoder (`BertModel`, ...) or an encoder QA model; not a decoder-only or encoder-decoder model."""
        check_encoder_backbone(backbone)

    @classmethod
    def _load_backbone(cls, path: str | os.PathLike, **kwargs) -> PreTrainedModel:
        """A folder whose `architectures` names a `...ForQuestionAnswering` class is loaded with
        `AutoModelForQuestionAnswering` (its span head is kept, see `_wrap`); any other with `AutoModel`."""
        loaded_config = AutoConfig.from_pretrained(path, **kwargs)
        if _is_qa_checkpoint(loaded_config):
            return AutoModelForQuestionAnswering.from_pretrained(path, **kwargs)
        return AutoModel.from_pretrained(path, **{**_encoder_kwargs(loaded_config), **kwargs})

    @classmethod
    def _wrap(cls, backbone: PreTrainedModel, config: PanmConfig) -> BertWithPanmForQuestionAnswering:
        """Wrap an encoder (`BertModel`, ...) or a QA model (`BertForQuestionAnswering`, ...).

        A QA model's encoder becomes the backbone and its span head `qa_outputs` is kept, so a
        wrapped QA checkpoint starts with its own logits; for a plain encoder `qa_outputs` is fresh.
        """
        span_head = getattr(backbone, "qa_outputs", None)
        encoder = getattr(backbone, backbone.base_model_prefix) if span_head is not None else backbone
        if span_head is not None and not (isinstance(span_head, nn.Linear) and span_head.out_features == 2):
            raise ValueError(
                f"backbone.qa_outputs must be a Linear(hidden, 2) span head; got {span_head!r}. "
                "Pass the encoder alone to start from a fresh span head."
            )
        model = cls(config, backbone=encoder)
        if span_head is not None:
            model.qa_outputs.load_state_dict(span_head.state_dict())
        return model

    def pointer_logits(
        self, memory_states: torch.Tensor, attention_mask: torch.Tensor, base_address: torch.Tensor | None = None
    ) -> torch.Tensor:
        """PANM's start and end scores: `(batch, slots, hidden)` -> `(batch, 2, slots)` (padding not yet masked)."""
        panm_output = self.panm(
            memory_states, attention_mask=attention_mask, num_steps=NUM_SPAN_STEPS, base_address=base_address
        )
        queries = panm_output.hidden_states.to(memory_states.dtype)  # (batch, 2, hidden)
        scale = 1.0 / math.sqrt(memory_states.shape[-1])
        return torch.einsum("bth,bsh->bts", queries, memory_states) * scale  # (batch, 2, slots)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        base_address: torch.LongTensor | None = None,
    ) -> QuestionAnsweringModelOutput | tuple:
        r"""Span-extraction forward.

        Args:
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds: the backbone's
                inputs (`[CLS] question [SEP] context [SEP]`); the mask also masks PANM's memory
                and the returned logits.
            start_positions, end_positions: `(batch,)` gold span token indices; positions outside
                the sequence are clamped to `seq_len` and ignored by the loss.
            output_attentions, output_hidden_states: return the backbone's attentions / hidden states.
            base_address: `(batch,)` PANM base addresses; default random in training, 0 in eval.

        Returns:
            `QuestionAnsweringModelOutput(loss, start_logits (batch, seq_len), end_logits (batch, seq_len))`.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        encoder_inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "inputs_embeds": inputs_embeds}
        # Not every encoder takes these (DistilBERT has no token types); pass them only when given.
        if token_type_ids is not None:
            encoder_inputs["token_type_ids"] = token_type_ids
        if position_ids is not None:
            encoder_inputs["position_ids"] = position_ids
        encoder_outputs = self.backbone(
            **encoder_inputs, **self._output_flags(output_attentions, output_hidden_states), return_dict=True
        )
        memory_states = encoder_outputs.last_hidden_state  # (batch, slots, hidden) = M
        if attention_mask is None:
            mask = torch.ones(memory_states.shape[:2], dtype=torch.bool, device=memory_states.device)
        else:
            mask = attention_mask.to(memory_states.device).bool()  # (batch, slots)

        span_logits = rearrange(self.qa_outputs(memory_states), "b s two -> b two s")  # (batch, 2, slots)
        logits = span_logits + self.pointer_logits(memory_states, mask, base_address).to(span_logits.dtype)
        logits = logits.masked_fill(~mask.unsqueeze(1), torch.finfo(logits.dtype).min)  # no mass on padding
        start_logits, end_logits = logits.unbind(dim=1)  # each (batch, slots)

        loss = None
        if start_positions is not None and end_positions is not None:
            # As BertForQuestionAnswering: positions outside the input are clamped and ignored.
            ignored_index = start_logits.shape[1]
            start_positions = start_positions.to(start_logits.device).reshape(-1).clamp(0, ignored_index)
            end_positions = end_positions.to(end_logits.device).reshape(-1).clamp(0, ignored_index)
            loss_fct = nn.CrossEntropyLoss(ignore_index=ignored_index)
            loss = (loss_fct(start_logits, start_positions) + loss_fct(end_logits, end_positions)) / 2

        output = QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=encoder_outputs.hidden_states,
            attentions=encoder_outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


BertWithPanmForQA = BertWithPanmForQuestionAnswering

__all__ = ["BertWithPanmForQA", "BertWithPanmForQuestionAnswering"]
