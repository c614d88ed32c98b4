"""Prompt length vs the model's context, counted with the target's own chat template and tokenizer.

Torch-free (jobs/tokenizer.py): an API process loads the target's tokenizer and config once (no weights), on the
first submission that needs it, and never imports eagle3 or torch.
"""
from __future__ import annotations

from jinja2.exceptions import TemplateError

from jobs import kinds, tokenizer

# SpeculativeDecoder's default tree depth (eagle3/decoder.py; the workers build their decoders with it). A test
# checks the two agree: eagle3 cannot be imported here, it pulls in torch.
DECODER_DEPTH = 5


def tree_headroom() -> int:
    """Context slots the decoder keeps free past the prompt for one draft tree: it rejects a prompt of
    max_context - depth - 2 tokens or more (eagle3/decoder.py, SpeculativeDecoder.generate_ids)."""
    return DECODER_DEPTH + 2


def too_long(target_name: str, job_type: str, prompt: str | None, max_new_tokens: int,
             messages: list[dict] | None = None, options: dict | None = None) -> str | None:
    """An error message if the item (a prompt or chat messages) cannot fit in the context, else None. The same bound
    the decoder applies, so an item accepted here is never rejected by the worker for its length. The job's kind
    says what the worker will build from the item (`options`: the job's kind-specific fields)."""
    chat = tokenizer.load(target_name)
    turns = kinds.get(job_type).longest_turns(prompt, messages, options or {})
    try:
        n, context = len(chat.encode_messages(turns)), chat.max_context
    except TemplateError as exc:  # e.g. a template that requires alternating user/assistant turns
        return f"the model's chat template refuses these messages: {exc}"
    if n + max_new_tokens > context:
        return (f"the prompt is {n} tokens; with max_new_tokens={max_new_tokens} it exceeds the model's context "
                f"of {context} tokens")
    if n >= context - tree_headroom():
        return (f"the prompt is {n} tokens; the decoder needs {tree_headroom()} of the model's context of "
                f"{context} tokens for its draft tree, so a prompt exceeds the model's context from "
                f"{context - tree_headroom()} tokens on")
    return None
