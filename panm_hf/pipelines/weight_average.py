"""An exponential moving average of a model's trainable weights, evaluated beside the weights themselves.

`--weight_average_decay d` keeps, after every optimizer step n (counted from 1), a float32 shadow

    average <- average + (1 - d_n) * (weight - average),    d_n = min(d, (1 + n) / (10 + n))

of every trainable parameter (d_n's warm-up, as TensorFlow's `ExponentialMovingAverage` with `num_updates`, keeps the
first steps' random weights from dominating). Training never sees it: the optimizer steps the model's own weights.
Each evaluation runs twice, on the weights and on the average, logging the average's metrics as
`<prefix>_average_<metric>` (`eval_average_loss`, `eval_test_average_loss`), so one run gives both curves. With a
constant learning rate the average is an ensemble of the last ~1 / (1 - d) steps' weights at no training cost (Polyak
averaging; checkpoint averaging in machine translation).

Backbone-agnostic: it touches `model.named_parameters()` only.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import TrainerCallback


def validate_weight_average_decay(decay: float | None) -> None:
    """ValueError naming `--weight_average_decay` unless it is None or in (0, 1)."""
    if decay is not None and not 0.0 < decay < 1.0:
        raise ValueError(
            f"--weight_average_decay must be in (0, 1), e.g. 0.998 (got {decay}); omit it to evaluate the weights "
            "alone."
        )


class WeightAverage:
    """The moving average of `model`'s trainable parameters (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        validate_weight_average_decay(decay)
        self.decay = decay
        self.num_updates = 0
        self.names = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
        parameters = dict(model.named_parameters())
        self.average = [parameters[name].detach().float().clone() for name in self.names]

    def _parameters(self, model: torch.nn.Module) -> list[torch.Tensor]:
        parameters = dict(model.named_parameters())
        missing = [name for name in self.names if name not in parameters]
        if missing:
            raise ValueError(
                f"The model lacks the averaged parameters {missing[:3]}; swap the average into the model it was made "
                "for."
            )
        return [parameters[name] for name in self.names]

    def current_decay(self) -> float:
        """d_n for the update about to be made (n = `num_updates + 1`)."""
        n = self.num_updates + 1
        return min(self.decay, (1 + n) / (10 + n))

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """Fold the model's current weights into the average (one optimizer step's worth)."""
        weight = 1.0 - self.current_decay()
        current = [parameter.detach().float() for parameter in self._parameters(model)]
        torch._foreach_lerp_(self.average, current, weight)
        self.num_updates += 1

    @contextmanager
    def swapped_in(self, model: torch.nn.Module):
        """Within the block the model holds the average; its own weights come back after, bit for bit."""
        parameters = self._parameters(model)
        saved = [parameter.detach().clone() for parameter in parameters]
        with torch.no_grad():
            for parameter, average in zip(parameters, self.average, strict=True):
                parameter.copy_(average)
        try:
            yield model
        finally:
            with torch.no_grad():
                for parameter, own in zip(parameters, saved, strict=True):
                    parameter.copy_(own)


class WeightAverageCallback(TrainerCallback):
    """Keeps a `WeightAverage` of a `Trainer`'s model: started from the weights training begins with (a resumed
    run's too: the average is not checkpointed), updated after every optimizer step."""

    def __init__(self, decay: float):
        validate_weight_average_decay(decay)
        self.decay = decay
        self.weight_average: WeightAverage | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.weight_average = WeightAverage(model, self.decay)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.weight_average.update(model)
