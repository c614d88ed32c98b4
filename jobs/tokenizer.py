"""The target's chat template and tokenizer without torch: what the API needs to count prompt tokens, and what the
worker uses to turn an item (a prompt or chat messages) into the token ids it decodes, so both agree by construction.

`transformers` imports torch as soon as it is installed, so this reads the model directory itself: `tokenizer.json`
with the `tokenizers` library and the chat template rendered with Jinja2 the way transformers renders it
(`apply_chat_template`: a sandboxed environment with trim_blocks/lstrip_blocks, then the text encoded without
adding special tokens). tests/test_messages.py checks the ids against eagle3's own tokenizers.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

DEFAULT_TARGET = "smollm2-135m-instruct"  # eagle3.target.DEFAULT_TARGET (not imported: it pulls in torch)
TINY_CONTEXT = 1024  # eagle3.target.tiny_config(): max_position_embeddings of the random test model


def turns(prompt: str | None, messages: list[dict] | None) -> list[dict]:
    """An item's chat: its messages, or its bare prompt as one user message (the same ids as the decoder's own
    chat encoding of that prompt)."""
    return messages if messages is not None else [{"role": "user", "content": prompt}]


class ByteChat:
    """The tiny random test model: byte tokens, BOS, and a plain-text template ("System: ...\\nUser: ...\\n
    Assistant: "). One user message gives exactly eagle3's ByteTokenizer.encode_chat."""

    bos = 256
    labels = {"system": "System", "user": "User", "assistant": "Assistant"}

    def __init__(self):
        self.max_context = TINY_CONTEXT

    def encode_messages(self, messages: list[dict]) -> list[int]:
        text = "".join(f"{self.labels[m['role']]}: {m['content']}\n" for m in messages) + "Assistant: "
        return [self.bos] + list(text.encode())


class HFChat:
    """A Hugging Face model directory: tokenizer.json + the chat template (tokenizer_config.json or
    chat_template.jinja)."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        config = json.loads((path / "tokenizer_config.json").read_text()) \
            if (path / "tokenizer_config.json").exists() else {}
        template = config.get("chat_template")
        if template is None and (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text()
        self.template = compile_template(template) if template else None
        self.specials = {k: token_text(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        model = json.loads((path / "config.json").read_text())
        self.max_context = model.get("max_position_embeddings", 2048)

    def encode_messages(self, messages: list[dict]) -> list[int]:
        if self.template is None:  # no template: the bare prompt, as eagle3's HFTokenizer does
            text = messages[-1]["content"] if len(messages) == 1 else \
                "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
            return self.tokenizer.encode(text).ids
        text = self.template.render(messages=messages, add_generation_prompt=True, **self.specials)
        return self.tokenizer.encode(text, add_special_tokens=False).ids


def token_text(token) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    return token.get("content") if isinstance(token, dict) else token


def compile_template(source: str):
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def cache_dir() -> Path:
    return Path(os.environ.get("EAGLE3_CACHE", Path.home() / ".cache" / "eagle3"))


def model_dir(name: str) -> Path:
    """The model directory of a target name. The default model is converted from its GGUF once by eagle3 (in a
    subprocess: the conversion needs torch, this process must not import it)."""
    if name != DEFAULT_TARGET:
        return Path(name)
    path = cache_dir() / DEFAULT_TARGET
    if not (path / "tokenizer.json").exists():
        subprocess.run([sys.executable, "-c", "from eagle3.target import _default_model_dir; _default_model_dir()"],
                       check=True, cwd=Path(__file__).resolve().parent.parent)
    return path


_lock = threading.Lock()
_loaded: dict[str, ByteChat | HFChat] = {}


def load(name: str) -> ByteChat | HFChat:
    """The chat tokenizer of a target name ("tiny", the default model, or a model directory), loaded once."""
    with _lock:
        if name not in _loaded:
            _loaded[name] = ByteChat() if name == "tiny" else HFChat(model_dir(name))
        return _loaded[name]
