"""Content review: the fixed policy taxonomy and the prompt templates (shared by the API's length check and the worker).

The label is never parsed from generated text: the worker scores every label as the start of the assistant's reply
(`SpeculativeDecoder.score_options`) and takes the most probable one; only the rationale is generated.
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


def classification_prompt(text: str) -> str:
    return (
        "You are a content moderator. Classify the text between the markers into exactly one policy category.\n"
        f"Categories:\n{_TAXONOMY}\n\n"
        f"<text>\n{text}\n</text>\n\n"
        "Answer with the category name only."
    )


def rationale_prompt(text: str, label: str) -> str:
    return (
        classification_prompt(text)
        + f"\n\nThe text was classified as \"{label}\". In one or two sentences, explain why."
    )


def longest_prompt(text: str) -> str:
    """The longest prompt the worker builds for this text (for the context-length check)."""
    return max((rationale_prompt(text, label) for label in LABELS), key=len)
