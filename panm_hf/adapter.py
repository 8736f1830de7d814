"""PANM's own weights apart from the backbone, saved and loaded as PEFT saves an adapter.

`model.save_panm(folder)` writes two small files:

* `panm_config.json`: a `PanmAdapterConfig`, the PANM hyperparameters, `placement`, `causal_memory`,
  `eos_decision`, the adapter
  class and the base model's `name_or_path` (what `from_backbone` recorded);
* `panm_model.safetensors`: every weight outside `backbone.`: PANM's `panm.*`, plus
  `output_norm.*` (`placement="residual"`) or the QA span head `qa_outputs.*`.

`Cls.from_panm(folder)` loads the base (the recorded one, or the one given), wraps it with
`from_backbone` and the saved PANM config, and loads those weights strictly. The backbone is the
base's own: with `placement="replace"` the wrapper drops the base's last decoder layer again when
it wraps it, so no backbone weight is ever saved.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from transformers.utils import cached_file, logging

from .configuration_panm import CAUSAL_MEMORIES, EOS_DECISIONS, PLACEMENTS, PanmConfig
from .memory_config import PanmMemoryConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .modeling_panm import PanmPreTrainedModel

logger = logging.get_logger(__name__)

PANM_CONFIG_NAME = "panm_config.json"
PANM_WEIGHTS_NAME = "panm_model.safetensors"
# from_pretrained arguments that also say where to fetch a PANM folder from the Hub.
HUB_KWARGS = ("cache_dir", "force_download", "proxies", "token", "local_files_only")


@dataclass(kw_only=True)
class PanmAdapterConfig(PanmMemoryConfig):
    r"""What `save_panm` writes to `panm_config.json` (flat, one key per field).

    Args:
        adapter_class (`str`): the PANM model class that saved the weights (`"PanmForSeq2SeqLM"`, ...).
        base_model_name_or_path (`str`, *optional*): the base model the weights go with, a local
            folder or Hub id (`config.name_or_path`); `""` when the model had none.
        placement (`str`, *optional*, defaults to `"stack"`): `PanmConfig.placement`.
        causal_memory (`str`, *optional*, defaults to `"sequence"`): `PanmConfig.causal_memory`.
        eos_decision (`str`, *optional*, defaults to `"shared"`): `PanmConfig.eos_decision`.
        **kwargs: the `PanmMemoryConfig` fields.
    """

    adapter_class: str
    base_model_name_or_path: str = ""
    placement: str = "stack"
    causal_memory: str = "sequence"
    eos_decision: str = "shared"

    def validate(self) -> None:
        """`PanmMemoryConfig.validate` plus `placement`, `causal_memory`, `eos_decision` and `adapter_class`;
        ValueError naming the field."""
        super().validate()
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement={self.placement!r} is not supported; choose one of {PLACEMENTS}.")
        if self.causal_memory not in CAUSAL_MEMORIES:
            raise ValueError(f"causal_memory={self.causal_memory!r} is not supported; choose one of {CAUSAL_MEMORIES}.")
        if self.eos_decision not in EOS_DECISIONS:
            raise ValueError(f"eos_decision={self.eos_decision!r} is not supported; choose one of {EOS_DECISIONS}.")
        if not isinstance(self.adapter_class, str) or not self.adapter_class:
            raise ValueError(f"adapter_class must name a PANM model class (got {self.adapter_class!r}).")

    @property
    def panm_kwargs(self) -> dict:
        """The `PanmConfig` fields `from_backbone` takes: PANM's hyperparameters, `placement`, `causal_memory`,
        `eos_decision`."""
        memory = {field.name: getattr(self, field.name) for field in fields(PanmMemoryConfig)}
        return {
            **memory, "placement": self.placement, "causal_memory": self.causal_memory,
            "eos_decision": self.eos_decision,
        }  # fmt: skip

    @classmethod
    def from_model(cls, model: PanmPreTrainedModel, base_model_name_or_path: str | None = None) -> PanmAdapterConfig:
        """The config of a PANM model; the base defaults to `model.config.name_or_path`."""
        base = base_model_name_or_path if base_model_name_or_path is not None else model.config.name_or_path
        return cls(
            **asdict(model.config.memory_config),
            adapter_class=type(model).__name__,
            base_model_name_or_path=os.fspath(base or ""),
            placement=model.config.placement,
            causal_memory=getattr(model.config, "causal_memory", "sequence"),
            eos_decision=getattr(model.config, "eos_decision", "shared"),
        )

    @classmethod
    def from_json_file(cls, path: str) -> PanmAdapterConfig:
        """Read a `panm_config.json`; ValueError naming unknown or missing fields."""
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{path} has fields this panm_hf does not know: {unknown}; it was saved by another panm_hf "
                "version: install that version (or a newer one) to load it."
            )
        if "adapter_class" not in data:
            raise ValueError(f"{path} has no adapter_class; it was not written by save_panm.")
        return cls(**data)

    def to_json_file(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(asdict(self), file, indent=2, sort_keys=True)
            file.write("\n")

    def check_adapter_class(self, model_class: type) -> None:
        """ValueError unless `model_class` is (a subclass of) the class that saved the weights."""
        if self.adapter_class not in {klass.__name__ for klass in model_class.__mro__}:
            raise ValueError(
                f"These PANM weights were saved from {self.adapter_class} (adapter_class in {PANM_CONFIG_NAME}); "
                f"load them with {self.adapter_class}.from_panm(...), not {model_class.__name__}.from_panm(...)."
            )


def panm_state_dict(model: PanmPreTrainedModel) -> dict[str, torch.Tensor]:
    """The entries of `model.state_dict()` outside the backbone (PANM's own weights)."""
    prefix = f"{model.base_model_prefix}."
    return {name: tensor for name, tensor in model.state_dict().items() if not name.startswith(prefix)}


def save_panm(
    model: PanmPreTrainedModel, save_directory: str | os.PathLike, base_model_name_or_path: str | None = None
) -> None:
    """Write `panm_config.json` and `panm_model.safetensors` (see `PanmPreTrainedModel.save_panm`)."""
    save_directory = os.fspath(save_directory)
    if os.path.isfile(save_directory):
        raise ValueError(f"save_directory={save_directory!r} is a file; pass a folder to write the PANM files in.")
    peft_modules = sorted({type(module).__name__ for module in model.modules() if _is_peft_module(module)})
    if peft_modules:
        raise ValueError(
            f"The model holds PEFT layers ({', '.join(peft_modules)}); save_panm saves PANM alone and would drop "
            "them. Save the PEFT model with its save_pretrained, or call merge_and_unload() first."
        )
    config = PanmAdapterConfig.from_model(model, base_model_name_or_path)
    if not config.base_model_name_or_path:
        logger.warning(
            "The model records no base model (config.name_or_path is empty: it was not made by from_backbone "
            "from a path); from_panm will need backbone=... . Pass base_model_name_or_path= to record one."
        )
    os.makedirs(save_directory, exist_ok=True)
    config.to_json_file(os.path.join(save_directory, PANM_CONFIG_NAME))
    weights = {name: tensor.detach().cpu().contiguous() for name, tensor in panm_state_dict(model).items()}
    save_file(weights, os.path.join(save_directory, PANM_WEIGHTS_NAME), metadata={"format": "pt"})


def from_panm(
    model_class: type[PanmPreTrainedModel],
    panm_name_or_path: str | os.PathLike,
    backbone: PreTrainedModel | str | os.PathLike | None,
    backbone_kwargs: dict,
) -> PanmPreTrainedModel:
    """Load a base, wrap it with the saved PANM config, load PANM's weights (see `PanmPreTrainedModel.from_panm`)."""
    hub_kwargs = {name: backbone_kwargs[name] for name in HUB_KWARGS if name in backbone_kwargs}
    config = PanmAdapterConfig.from_json_file(_panm_file(panm_name_or_path, PANM_CONFIG_NAME, hub_kwargs))
    config.check_adapter_class(model_class)
    if backbone is None:
        where = f"base_model_name_or_path in {os.fspath(panm_name_or_path)}/{PANM_CONFIG_NAME}"
        backbone = _load_base(model_class, config.base_model_name_or_path, backbone_kwargs, where)
    elif isinstance(backbone, (str, os.PathLike)):
        backbone = _load_base(model_class, os.fspath(backbone), backbone_kwargs, "backbone")
    elif set(backbone_kwargs) - set(HUB_KWARGS):
        raise ValueError(
            f"{sorted(set(backbone_kwargs) - set(HUB_KWARGS))} go to the base's from_pretrained, but backbone is "
            "an already loaded model; pass them where you load it, or pass its path as backbone."
        )
    model = model_class.from_backbone(backbone, **config.panm_kwargs)
    weights_path = _panm_file(panm_name_or_path, PANM_WEIGHTS_NAME, hub_kwargs)
    load_panm_weights(model, load_file(weights_path), source=weights_path)
    return model.eval()


def load_panm_weights(model: PanmPreTrainedModel, weights: dict[str, torch.Tensor], source: str) -> None:
    """Load `weights` into the model's PANM strictly: ValueError naming missing, unexpected or misshapen keys."""
    expected = panm_state_dict(model)
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{source} does not hold {type(model).__name__}'s PANM weights: missing {missing}, unexpected "
            f"{unexpected}. Load it with the class and placement that saved it (see {PANM_CONFIG_NAME})."
        )
    for name, tensor in weights.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{name} in {source} has shape {tuple(tensor.shape)}, but the wrapped base needs "
                f"{tuple(expected[name].shape)}: the base differs from the one the PANM weights were trained on "
                f"(e.g. another hidden size). Pass that base (base_model_name_or_path in {PANM_CONFIG_NAME})."
            )
    model.load_state_dict(weights, strict=False)


def _panm_file(panm_name_or_path: str | os.PathLike, filename: str, hub_kwargs: dict) -> str:
    # A local folder written by save_panm, else a Hub repo id (fetched and cached as from_pretrained does).
    name = os.fspath(panm_name_or_path)
    if os.path.isdir(name):
        path = os.path.join(name, filename)
        if not os.path.isfile(path):
            raise ValueError(f"{name!r} has no {filename}; it is not a folder written by model.save_panm(...).")
        return path
    if _looks_local(name):
        raise ValueError(f"The PANM folder {name!r} does not exist; pass the folder model.save_panm(...) wrote.")
    return cached_file(name, filename, **hub_kwargs)


def _load_base(model_class: type[PanmPreTrainedModel], name: str, backbone_kwargs: dict, where: str) -> PreTrainedModel:
    """The base model at `name` (`where` says which argument named it), or a ValueError saying how to fix it."""
    fix = "pass backbone= (the base model, a local folder or a Hub id) to from_panm"
    if not name:
        raise ValueError(f"No base model is recorded ({where} is empty); {fix}.")
    if not os.path.isdir(name) and _looks_local(name):
        raise ValueError(f"The base model folder {name!r} ({where}) does not exist; {fix}.")
    local_config = os.path.join(name, "config.json")
    if os.path.isfile(local_config):
        with open(local_config, encoding="utf-8") as file:
            if json.load(file).get("model_type") == PanmConfig.model_type:
                raise ValueError(
                    f"{name!r} ({where}) holds a whole PANM model, not a base model; {fix}, e.g. the model "
                    "that was wrapped with from_backbone."
                )
    try:
        return model_class._load_backbone(name, **backbone_kwargs)
    except OSError as error:
        raise ValueError(f"Could not load the base model {name!r} ({where}): {error} To fix it, {fix}.") from error


def _looks_local(name: str) -> bool:
    # A Hub id is "name" or "owner/name": anything else is a local path.
    return os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or "\\" in name


def _is_peft_module(module: torch.nn.Module) -> bool:
    return type(module).__module__.split(".")[0] == "peft"


__all__ = ["PANM_CONFIG_NAME", "PANM_WEIGHTS_NAME", "PanmAdapterConfig", "from_panm", "panm_state_dict", "save_panm"]
