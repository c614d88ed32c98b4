"""Token streaming of one item, from the worker that decodes it to the API request that waits for it.

The worker appends text increments to a Redis stream per item (XADD); the API reads it from the start (XREAD), so
nothing is lost if it starts reading after the first tokens. Only the text the final answer is certain to start
with is sent: text that could still turn out to be part of a stop string is held back (the stored answer is cut
before the first stop string), and so is a trailing U+FFFD (the tokens so far may end inside a multi-byte
character). Once the item's result is stored the API sends what is missing, so the concatenated increments always
equal the stored answer. The stream is a convenience: the result in Postgres stays the source of truth (if a retried
decode sampled a different answer than the one partly streamed, the API ends the stream with an error event).

Torch-free: the worker hands in its tokenizer's decode function.
"""
from __future__ import annotations

import logging

import redis

log = logging.getLogger(__name__)
TTL_S = 600  # a stream outlives its request; expired so that abandoned ones do not pile up


def key(queue: str, item_id: int) -> str:
    """Per queue as well as per item: deployments (and test runs) sharing one Redis have their own item ids."""
    return f"eagle3:tokens:{queue}:{item_id}"


def certain_text(text: str, stops: list[str] | None) -> str:
    """The part of the decoded text so far that the final answer certainly starts with."""
    if stops:
        hits = [text.find(stop) for stop in stops if stop in text]
        # A stop string may be completed by later tokens: hold back as many characters as the longest one has.
        end = min(hits) if hits else max(0, len(text) - max(map(len, stops)))
        text = text[:end]
    return text.rstrip("\ufffd").replace("\x00", "\ufffd")  # NUL: stored as U+FFFD (kinds.storable)


class Publisher:
    """The worker's side for one item: feed it the tokens as they are emitted."""

    def __init__(self, client: redis.Redis, stream_key: str, decode, stops: list[str] | None):
        self.client, self.key, self.decode, self.stops = client, stream_key, decode, stops
        self.tokens: list[int] = []
        self.failed = False
        # A second decode of the item (its batch failed and is retried item by item, or it was redelivered) goes
        # on from what the first one already sent, rather than sending it again.
        self.sent = self.already_sent()

    def already_sent(self) -> str:
        try:
            return "".join(fields[b"delta"].decode() for _, fields in self.client.xrange(self.key))
        except redis.RedisError as exc:
            log.warning("token stream %s unavailable: %r", self.key, exc)
            self.failed = True
            return ""

    def add(self, tokens: list[int]) -> None:
        self.tokens += tokens
        text = certain_text(self.decode(self.tokens), self.stops)
        if len(text) <= len(self.sent) or self.failed or not text.startswith(self.sent):
            return
        try:
            self.client.xadd(self.key, {"delta": text[len(self.sent):]})
            self.client.expire(self.key, TTL_S)
        except redis.RedisError as exc:  # streaming is best effort: the answer still comes from the result
            log.warning("token stream %s unavailable: %r", self.key, exc)
            self.failed = True
            return
        self.sent = text


def read(client: redis.Redis, stream_key: str, after: str, block_ms: int) -> tuple[list[str], str]:
    """The increments appended after stream id `after` ("0": from the start), waiting up to `block_ms` for the
    first; returns them and the id to read after next."""
    answer = client.xread({stream_key: after}, block=block_ms)
    deltas = []
    for _, entries in answer or ():
        for entry_id, fields in entries:
            after = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            deltas.append(fields[b"delta"].decode())
    return deltas, after
