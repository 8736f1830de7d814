"""PanmForSeq2SeqLM under Trainer and Accelerate (CPU)."""

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from conftest import BACKBONES, TINY_PANM
from transformers import AutoModelForSeq2SeqLM, Trainer, TrainingArguments

from panm_hf import PanmForSeq2SeqLM


def copy_dataset(num_examples=64, length=6, seed=0):
    """A tiny copy task: the target is the source."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, 20, (num_examples, length), generator=generator)
    return [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row.clone()} for row in tokens]


def tiny_model(placement="replace"):
    torch.manual_seed(0)
    backbone = AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]())
    return PanmForSeq2SeqLM.from_backbone(backbone, placement=placement, **TINY_PANM)


def test_trainer_training_loss_goes_down(tmp_path):
    model = tiny_model()
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=40, per_device_train_batch_size=16, learning_rate=3e-3,
        logging_steps=10, report_to=[], use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=copy_dataset())
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 4
    assert losses[-1] < 0.7 * losses[0], losses
    # Trainer keeps the columns forward names and drops nothing it needs
    assert {"input_ids", "attention_mask", "labels"} <= set(trainer._signature_columns)


def test_accelerator_bf16_autocast_step():
    AcceleratorState._reset_state(reset_partial_state=True)  # Trainer may have set up a fp32 state already
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = tiny_model("stack")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    batch = copy_dataset(num_examples=4)
    inputs = {key: torch.stack([example[key] for example in batch]) for key in batch[0]}
    before = model.panm.controller.output_mlp[-1].weight.detach().clone()
    with accelerator.autocast():
        outputs = model(**inputs)
    # accelerate hands outputs back in fp32; values computed under bf16 autocast round-trip exactly
    assert torch.equal(outputs.logits, outputs.logits.bfloat16().float())
    assert torch.isfinite(outputs.logits.float()).all() and torch.isfinite(outputs.loss)
    accelerator.backward(outputs.loss)
    optimizer.step()
    # the zero-initialised residual leaves zero after one step: PANM starts learning
    assert not torch.equal(model.panm.controller.output_mlp[-1].weight, before)
