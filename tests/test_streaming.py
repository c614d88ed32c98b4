"""jobs/streaming.py against the real Redis: what text may be sent before the answer is final, and a publisher's
increments read back in order."""
import uuid

import redis

from jobs import streaming
from jobs.config import get_settings
from jobs.kinds import cut_at_stop


def byte_decode(tokens: list[int]) -> str:
    return bytes(tokens).decode("utf-8", errors="replace")


def test_certain_text_is_always_a_prefix_of_the_final_answer():
    text = "Hello, wörld! Stop here. More text after."
    tokens = list(text.encode())
    for stops in (None, ["Stop"], ["here.", "Hello, w"], ["wö"], ["absent"]):
        final, _ = cut_at_stop(byte_decode, text, tokens, stops)
        for n in range(len(tokens) + 1):
            assert final.startswith(streaming.certain_text(byte_decode(tokens[:n]), stops)), (stops, n)
    # a multi-byte character cut in half is held back, not sent as U+FFFD
    assert streaming.certain_text(byte_decode(list("wö".encode())[:2]), None) == "w"
    # text that may still become a stop string is held back; a complete stop ends the text
    assert streaming.certain_text("abc", ["cde"]) == ""
    assert streaming.certain_text("abcdef", ["cde"]) == "ab"
    assert streaming.certain_text("abcdefgh", ["xyz"]) == "abcde"


def test_publisher_increments_read_back_in_order():
    client = redis.Redis.from_url(get_settings().redis_url)
    key = streaming.key(f"test-{uuid.uuid4().hex}", 1)
    try:
        publisher = streaming.Publisher(client, key, byte_decode, ["!"])
        for piece in ("Hel", "lo", " wö", "rld", "! bye"):
            publisher.add(list(piece.encode()))
        deltas, after = streaming.read(client, key, "0", 100)
        assert "".join(deltas) == "Hello wörld" and len(deltas) > 1
        assert 0 < client.ttl(key) <= streaming.TTL_S
        assert streaming.read(client, key, after, 10) == ([], after)  # nothing new after the last one read
    finally:
        client.delete(key)


def test_a_second_decode_goes_on_from_what_was_sent():
    """A retried or redelivered item decodes from the start again: its publisher sends only what is new."""
    client = redis.Redis.from_url(get_settings().redis_url)
    key = streaming.key(f"test-{uuid.uuid4().hex}", 2)
    try:
        streaming.Publisher(client, key, byte_decode, None).add(list(b"Hello"))
        again = streaming.Publisher(client, key, byte_decode, None)
        assert again.sent == "Hello"
        again.add(list(b"Hel"))
        again.add(list(b"lo world"))
        deltas, _ = streaming.read(client, key, "0", 100)
        assert deltas == ["Hello", " world"]
    finally:
        client.delete(key)
