"""The registry of job kinds: the one place that says what differs between a generation job and a review job.

A kind says which job-level fields it takes (stored in jobs.options), which items it refuses, what the decoder is
given for an item, and how the decoder's answer becomes the item's result. The API (validation, the context-length
check) and the worker (decoding) look kinds up here by the job's `type` and never branch on it.

Torch-free: the worker hands in the decoder's scoring function; nothing here imports eagle3.
Adding a kind: one subclass, `register`-ed below; the jobs.type check constraint lists the names, so a new one also
needs a migration.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar

from . import review, tokenizer

# Job-level fields that belong to some kind (a job of another kind may not set them).
KIND_FIELDS = ("labels", "policy")


@dataclass(frozen=True)
class ModelInput:
    """What the decoder generates from for one item, and what the kind already decided before generating."""
    turns: list[dict]
    verdict: dict | None = None


class Kind:
    name: ClassVar[str]
    fields: ClassVar[tuple[str, ...]] = ()  # which of KIND_FIELDS this kind takes

    def options(self, job) -> dict:
        """The job's kind-specific fields that are set (what jobs.options stores)."""
        return {f: getattr(job, f) for f in self.fields if getattr(job, f, None) is not None}

    def refused_fields(self, job) -> list[str]:
        """Kind-specific fields set on a job of a kind that does not take them."""
        return [f for f in KIND_FIELDS if f not in self.fields and getattr(job, f, None) is not None]

    def shown(self, options: dict) -> dict:
        """The kind's fields as the job object shows them (defaults filled in)."""
        return {}

    def check_item(self, prompt: str | None, messages: list[dict] | None) -> tuple[str, str] | None:
        """(field, message) if this kind cannot take the item."""
        return None

    def longest_turns(self, prompt: str | None, messages: list[dict] | None, options: dict) -> list[dict]:
        """The longest input the worker will build for the item (the API's context-length check counts it)."""
        return tokenizer.turns(prompt, messages)

    def model_input(self, item, options: dict, score: Callable) -> ModelInput:
        """`item`: a claimed item (prompt, messages, params); `score(prompt, choices)`: the decoder's log-probability
        of each choice (a string) as the start of the reply."""
        return ModelInput(tokenizer.turns(item.prompt, item.messages))

    def result(self, item, given: ModelInput, text: str, token_ids: list[int], stats: dict,
               decode: Callable) -> tuple[dict, dict]:
        """(output, stats) of the item from the decoder's answer."""
        raise NotImplementedError


KINDS: dict[str, Kind] = {}


def register(kind: type[Kind]) -> type[Kind]:
    KINDS[kind.name] = kind()
    return kind


def get(name: str) -> Kind:
    return KINDS[name]


@register
class Generation(Kind):
    """The answer to a prompt or a chat; stop strings cut it after decoding."""
    name = "generation"

    def result(self, item, given, text, token_ids, stats, decode):
        cut, kept = cut_at_stop(decode, text, token_ids, item.params.get("stop"))
        if len(kept) < len(token_ids) or cut != text:
            stats = {**stats, "finish_reason": "stop"}
        return {"text": storable(cut), "token_ids": kept}, stats


@register
class Review(Kind):
    """A verdict on a text: the most probable label (scored, not generated), then a generated rationale."""
    name = "review"
    fields = ("labels", "policy")

    def shown(self, options):
        return {"labels": review.labels_of(options), "policy": options.get("policy")}

    def check_item(self, prompt, messages):
        if messages is not None:
            return "messages", "a review item takes the text to judge as `prompt`"
        return None

    def longest_turns(self, prompt, messages, options):
        return tokenizer.turns(review.longest_prompt(prompt, options), None)

    def model_input(self, item, options, score):
        verdict = label_of(score, item.prompt, options)
        return ModelInput(tokenizer.turns(review.rationale_prompt(item.prompt, verdict["label"], options), None),
                          verdict)

    def result(self, item, given, text, token_ids, stats, decode):
        return {**given.verdict, "rationale": storable(text)}, stats


def label_of(score: Callable, text: str, options: dict | None = None) -> dict:
    """The verdict from the target's probabilities of each label as the start of its reply (no text parsing)."""
    labels = review.labels_of(options)
    logprobs = score(review.classification_prompt(text, options), labels)
    top = max(logprobs)
    weights = [math.exp(lp - top) for lp in logprobs]
    probs = [w / sum(weights) for w in weights]
    best = max(range(len(labels)), key=probs.__getitem__)
    return {"label": labels[best], "score": probs[best], "label_scores": dict(zip(labels, probs))}


def cut_at_stop(decode, text: str, token_ids: list[int], stops: list[str] | None) -> tuple[str, list[int]]:
    """The text before the first stop string that appears, and the fewest tokens whose text reaches past that stop.
    Unchanged when no stop string appears. (The decoder does not know the stop strings, so it decodes on to
    max_new_tokens or its end-of-turn token; only the answer is cut.)"""
    hits = [(text.find(stop), stop) for stop in stops or () if stop in text]
    if not hits:
        return text, token_ids
    at, stop = min(hits)
    through = text[:at + len(stop)]
    n = next((n for n in range(1, len(token_ids) + 1) if decode(token_ids[:n]).startswith(through)), len(token_ids))
    return text[:at], token_ids[:n]


def storable(text: str) -> str:
    """Postgres text and JSONB cannot hold NUL; a model may still emit it (U+FFFD instead; token_ids keep the truth)."""
    return text.replace("\x00", "\ufffd")
