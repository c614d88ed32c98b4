"""Content review: the built-in policy taxonomy and the prompt templates (shared by the API's length check and the
worker).

A job may bring its own label set and policy text (`labels`, `policy`); without them the built-in taxonomy below is
used. The label is never parsed from generated text: the worker scores every label as the start of the assistant's
reply (`SpeculativeDecoder.score_options`) and takes the most probable one; only the rationale is generated.
"""
from __future__ import annotations

LABELS: dict[str, str] = {
    "safe": "acceptable content that breaks no policy",
    "spam": "unsolicited advertising, scams, phishing, repetitive or deceptive promotion",
    "harassment": "insults, threats or bullying aimed at a person",
    "hate": "attacks on people for a protected attribute (race, religion, gender, ...)",
    "violence": "threats, incitement or glorification of violence",
    "sexual": "sexually explicit content",
    "self-harm": "encouragement or instructions for suicide or self-injury",
    "other": "breaks a policy not listed above",
}

_TAXONOMY = "\n".join(f"- {name}: {description}" for name, description in LABELS.items())


def labels_of(options: dict | None) -> list[str]:
    """The job's label set: its own `labels`, else the built-in taxonomy's names."""
    return list((options or {}).get("labels") or LABELS)


def _categories(options: dict | None) -> str:
    labels = (options or {}).get("labels")
    return _TAXONOMY if not labels else "\n".join(f"- {label}" for label in labels)


def classification_prompt(text: str, options: dict | None = None) -> str:
    """`options`: the job's {labels, policy}; without them, the built-in taxonomy (the prompt is then unchanged from
    before per-job labels existed)."""
    policy = (options or {}).get("policy")
    return (
        "You are a content moderator. "
        + (f"Apply this policy:\n{policy}\n\n" if policy else "")
        + "Classify the text between the markers into exactly one policy category.\n"
        f"Categories:\n{_categories(options)}\n\n"
        f"<text>\n{text}\n</text>\n\n"
        "Answer with the category name only."
    )


def rationale_prompt(text: str, label: str, options: dict | None = None) -> str:
    return (
        classification_prompt(text, options)
        + f"\n\nThe text was classified as \"{label}\". In one or two sentences, explain why."
    )


def longest_prompt(text: str, options: dict | None = None) -> str:
    """The longest prompt the worker builds for this text (for the context-length check)."""
    return max((rationale_prompt(text, label, options) for label in labels_of(options)), key=len)
