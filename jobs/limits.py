"""Prompt length vs the model's context, counted with the target's own chat template and tokenizer.

An API process loads the target's tokenizer and config once (no weights), on the first submission that needs it.
"""
from __future__ import annotations

import inspect
import threading
from functools import cache

from jobs import review

_lock = threading.Lock()
_targets: dict = {}


def target(name: str):
    with _lock:
        if name not in _targets:
            from eagle3.target import load_tokenizer
            _targets[name] = load_tokenizer(name)
        return _targets[name]


def prompt_for(job_type: str, prompt: str) -> str:
    """The longest prompt the worker will send to the decoder for this item."""
    return review.longest_prompt(prompt) if job_type == "review" else prompt


@cache
def tree_headroom() -> int:
    """Context slots the decoder keeps free past the prompt for one draft tree: it rejects a prompt of
    max_context - depth - 2 tokens or more (eagle3/decoder.py, SpeculativeDecoder.generate_ids). The workers build
    their decoders with the default depth."""
    from eagle3.decoder import SpeculativeDecoder

    return inspect.signature(SpeculativeDecoder).parameters["depth"].default + 2


def too_long(target_name: str, job_type: str, prompt: str, max_new_tokens: int) -> str | None:
    """An error message if the item cannot fit in the context, else None. The same bound the decoder applies, so
    an item accepted here is never rejected by the worker for its length."""
    t = target(target_name)
    n = t.count_tokens(prompt_for(job_type, prompt))
    if n + max_new_tokens > t.max_context:
        return (f"the prompt is {n} tokens; with max_new_tokens={max_new_tokens} it exceeds the model's context "
                f"of {t.max_context} tokens")
    if n >= t.max_context - tree_headroom():
        return (f"the prompt is {n} tokens; the decoder needs {tree_headroom()} of the model's context of "
                f"{t.max_context} tokens for its draft tree, so a prompt exceeds the model's context from "
                f"{t.max_context - tree_headroom()} tokens on")
    return None
