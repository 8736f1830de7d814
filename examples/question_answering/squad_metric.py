"""The official SQuAD v1.1 evaluation (exact match and token F1), offline.

Follows the official ``evaluate-v1.1.py`` script (Rajpurkar et al., 2016), which
``evaluate.load("squad")`` wraps but can only fetch from the Hub: answers are
normalised (lowercase, punctuation removed, the articles "a", "an", "the" removed,
whitespace collapsed), each prediction is scored against every gold answer and the
best score is kept, and the means are reported as percentages.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop articles, collapse whitespace (the official order)."""
    text = text.lower()
    text = "".join(char for char in text if char not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> float:
    """Token-overlap F1 between the normalised prediction and one gold answer."""
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    num_same = sum((Counter(prediction_tokens) & Counter(ground_truth_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(ground_truth_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """SQuAD v1.1 EM and F1 (x100) over the questions in `references`.

    Args:
        predictions: question id -> predicted answer text.
        references: question id -> the gold answer texts (any of them counts).

    Returns:
        `{"exact_match": ..., "f1": ...}`; a question without a prediction scores 0, as in
        the official script.
    """
    if not references:
        raise ValueError("references is empty; pass at least one question id with its gold answers.")
    exact_match = f1 = 0.0
    for question_id, gold_answers in references.items():
        if isinstance(gold_answers, str):
            raise ValueError(f"references[{question_id!r}] must be a list of answer strings, not a single string.")
        if question_id not in predictions:
            continue
        prediction = predictions[question_id]
        exact_match += max(exact_match_score(prediction, gold) for gold in gold_answers)
        f1 += max(f1_score(prediction, gold) for gold in gold_answers)
    return {"exact_match": 100.0 * exact_match / len(references), "f1": 100.0 * f1 / len(references)}


__all__ = ["exact_match_score", "f1_score", "normalize_answer", "squad_scores"]
