"""`--weight_average_decay`: the moving average of the weights, evaluated beside them by the examples' Trainer."""

from __future__ import annotations

import pytest
import torch
from test_seq2seq_trainer import build_model, copy_task
from transformers import Seq2SeqTrainingArguments, default_data_collator

from panm_hf.pipelines.seq2seq import ModelArguments, PanmSeq2SeqTrainer, validate_model_args
from panm_hf.pipelines.weight_average import WeightAverage, WeightAverageCallback


def test_update_follows_the_warmed_up_decay():
    layer = torch.nn.Linear(3, 2)
    layer.bias.requires_grad_(False)  # frozen parameters are not averaged
    average = WeightAverage(layer, decay=0.9)
    assert average.names == ["weight"]
    start = layer.weight.detach().clone()
    expected = start.clone()
    for step in range(1, 100):
        with torch.no_grad():
            layer.weight.add_(0.1 * step)
        d = min(0.9, (1 + step) / (10 + step))
        assert average.current_decay() == d
        average.update(layer)
        expected = d * expected + (1 - d) * layer.weight.detach()
    torch.testing.assert_close(average.average[0], expected)
    assert average.current_decay() == 0.9  # the warm-up has ended: (1 + 100) / 110 > 0.9
    assert not torch.equal(average.average[0], layer.weight.detach())


def test_swapped_in_holds_the_average_and_restores_the_weights_bit_for_bit():
    layer = torch.nn.Linear(4, 4)
    average = WeightAverage(layer, decay=0.5)
    with torch.no_grad():
        layer.weight.mul_(3.0)
    average.update(layer)
    own = layer.weight.detach().clone()
    x = torch.randn(2, 4)
    with average.swapped_in(layer):
        torch.testing.assert_close(layer.weight.detach(), average.average[0], rtol=0, atol=0)
        averaged_output = layer(x)
    assert torch.equal(layer.weight.detach(), own)
    assert not torch.equal(averaged_output, layer(x))
    # restored even when the block fails
    with pytest.raises(RuntimeError, match="inside"), average.swapped_in(layer):
        raise RuntimeError("inside")
    assert torch.equal(layer.weight.detach(), own)
    with (
        pytest.raises(ValueError, match="lacks the averaged parameters"),
        average.swapped_in(torch.nn.Linear(4, 4, bias=False)),
    ):
        pass


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5, 1.5])
def test_a_decay_outside_zero_one_is_refused_naming_the_flag(decay):
    with pytest.raises(ValueError, match="--weight_average_decay"):
        validate_model_args(ModelArguments(weight_average_decay=decay), scores_weight_average=True)
    with pytest.raises(ValueError, match="--weight_average_decay"):
        WeightAverageCallback(decay)


def test_only_a_script_that_scores_the_average_takes_the_flag():
    validate_model_args(ModelArguments(weight_average_decay=0.99), scores_weight_average=True)
    with pytest.raises(ValueError, match="--weight_average_decay is scored by the translation and SCAN examples only"):
        validate_model_args(ModelArguments(weight_average_decay=0.99))


def test_trainer_evaluates_the_average_beside_the_weights_and_trains_the_weights(tmp_path):
    # evaluations between steps (a DataLoader iterator draws from the random stream dropout uses): the average's
    # pass must leave training as it would be without it
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=16, per_device_eval_batch_size=8, learning_rate=3e-3,
        num_train_epochs=1, save_strategy="no", report_to=[], use_cpu=True, seed=0, data_seed=0,
        eval_strategy="steps", eval_steps=1,
    )  # fmt: skip
    train, evaluation = copy_task(64, seed=0), copy_task(16, seed=1)

    def trainer_of(model, decay=None):
        return PanmSeq2SeqTrainer(model=model, args=args, train_dataset=train, eval_dataset={"test": evaluation},
                                  data_collator=default_data_collator, weight_average_decay=decay)  # fmt: skip

    def trained(decay):
        model = build_model()
        trainer = trainer_of(model, decay)
        trainer.train()
        return model, trainer

    plain_model, plain = trained(None)
    model, trainer = trained(0.8)
    # the average is a shadow: the trained weights are those of a run without it
    for (name, p), (_, q) in zip(model.named_parameters(), plain_model.named_parameters(), strict=True):
        assert torch.equal(p, q), name
    average = trainer.weight_average_callback.weight_average
    assert average.num_updates == 4  # 64 samples / 16 per step
    metrics = trainer.evaluate()
    assert metrics["eval_test_loss"] == plain.evaluate()["eval_test_loss"]
    with average.swapped_in(model):
        by_hand = trainer_of(model).evaluate()["eval_test_loss"]
    assert metrics["eval_test_average_loss"] == by_hand != metrics["eval_test_loss"]
    assert "eval_test_average_loss" not in plain.evaluate()
    # a script's own scoring of the average: within the block evaluate scores what the model holds, once
    with trainer.weight_average_swapped_in() as averaged:
        assert averaged is model
        inside = trainer.evaluate()
    assert inside["eval_test_loss"] == by_hand and "eval_test_average_loss" not in inside
    assert trainer.evaluate()["eval_test_loss"] == metrics["eval_test_loss"]  # the weights are back
    with pytest.raises(ValueError, match="--weight_average_decay"), plain.weight_average_swapped_in():
        pass
    # predict (BLEU's generation in the translation example) runs on the weights alone
    assert set(trainer.predict(evaluation).metrics) == set(plain.predict(evaluation).metrics)
