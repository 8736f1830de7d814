"""A Trainer whose `evaluate()` scores text answers with the official SQuAD v1.1 EM/F1.

Trainer's own `compute_metrics` only runs when the evaluation set has labels and only
sees logits; extractive QA needs the windows' offsets and the questions' gold answers
to turn per-window logits into answer text first. So `evaluate()` and `predict()` run the
prediction loop, post-process with `utils_qa.postprocess_qa_predictions` and score with
`squad_metric.squad_scores` (both beside this file; transformers' run_qa example does the same);
`predict()` scores only when every question has a gold answer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from squad_metric import squad_scores
from transformers import Trainer
from transformers.trainer_utils import EvalLoopOutput, PredictionOutput, speed_metrics
from utils_qa import postprocess_qa_predictions


class QuestionAnsweringTrainer(Trainer):
    """`Trainer` plus SQuAD answer scoring in `evaluate()` and `predict()`.

    Args:
        eval_examples: the question records behind `eval_dataset` (`id`, `context`, `answers`).
        n_best_size: start/end candidates tried per window in post-processing.
        max_answer_length: longest answer, in tokens.
        *args, **kwargs: as `Trainer`; `eval_dataset` holds the windows from
            `prepare_validation_features` (with `example_id` and `offset_mapping`).
    """

    def __init__(
        self, *args, eval_examples: Sequence[dict] | None = None, n_best_size: int = 20, max_answer_length: int = 30,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.n_best_size = n_best_size
        self.max_answer_length = max_answer_length
        self.last_predictions: dict[str, str] = {}

    def evaluate(
        self,
        eval_dataset=None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
        eval_examples: Sequence[dict] | None = None,
    ) -> dict[str, float]:
        eval_dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        eval_examples = eval_examples if eval_examples is not None else self.eval_examples
        if eval_dataset is None or eval_examples is None:
            raise ValueError("evaluate() needs eval_dataset (windows) and eval_examples (questions with answers).")
        _, metrics = self._answer(eval_dataset, eval_examples, ignore_keys, metric_key_prefix, is_test=False)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(
        self,
        test_dataset,
        test_examples: Sequence[dict],
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "test",
    ) -> PredictionOutput:
        """Answer the questions of `test_examples` (windows in `test_dataset`); the texts land in
        `last_predictions`, EM/F1 in the metrics when every question has a gold answer."""
        output, metrics = self._answer(test_dataset, test_examples, ignore_keys, metric_key_prefix, is_test=True)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        return PredictionOutput(predictions=output.predictions, label_ids=None, metrics=metrics)

    def _answer(self, dataset, examples, ignore_keys, metric_key_prefix, is_test: bool) -> tuple[EvalLoopOutput, dict]:
        """Run the prediction loop, post-process to answer texts, score them when gold answers exist."""
        dataloader = self.get_test_dataloader(dataset) if is_test else self.get_eval_dataloader(dataset)
        start_time = time.time()
        output = self.evaluation_loop(
            dataloader, description="Prediction" if is_test else "Evaluation", prediction_loss_only=False,
            ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix,
        )
        start_logits, end_logits = output.predictions[:2]
        windows = dataset.select_columns(["example_id", "offset_mapping"]).to_list()
        self.last_predictions = postprocess_qa_predictions(
            examples, windows, start_logits, end_logits,
            n_best_size=self.n_best_size, max_answer_length=self.max_answer_length,
        )
        metrics = {}
        if all(example.get("answers") and example["answers"]["text"] for example in examples):
            references = {example["id"]: example["answers"]["text"] for example in examples}
            scores = squad_scores(self.last_predictions, references)
            metrics = {f"{metric_key_prefix}_{name}": value for name, value in scores.items()}
        metrics.update(output.metrics)
        metrics.update(speed_metrics(metric_key_prefix, start_time, num_samples=output.num_samples))
        return output, metrics
