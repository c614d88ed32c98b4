"""Decode a batch of items: claim them, decode together (grouped by decode params), record results.

Idempotent by construction: claiming skips finished items, and each result row is inserted once (primary key =
item id). A batch delivered twice therefore neither loses nor duplicates a result. No transaction is open while
the model runs.
"""
from __future__ import annotations

import json
import logging
import time
from collections import defaultdict

from sqlalchemy import exc as sa_exc

from jobs import kinds, lifecycle
from jobs.lifecycle import Claimed, Outcome

from . import metrics

log = logging.getLogger(__name__)
# What SQLAlchemy raises when Postgres cannot be reached or the connection dropped (as opposed to a bad statement).
DB_UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError)


def process(Session, engine, item_ids: list[int], max_attempts: int, db_retry_s: float = 0.0,
            owner: str | None = None, lease_s: float = 60.0, publisher=None) -> int:
    """Returns the number of results written. Raises when Postgres is unreachable at the claim, or still
    unreachable `db_retry_s` after the batch was decoded (the caller hands the items back to the queue).
    `owner`: the worker's lease owner (worker/lease.py); its results are written only for items it still holds.
    `publisher(item, decode)`: a jobs.streaming.Publisher for an item whose tokens are streamed (None: no streaming)."""
    with Session.begin() as session:
        claimed, gave_up = lifecycle.claim(session, sorted(set(item_ids)), max_attempts, owner, lease_s)
        written = lifecycle.record(session, gave_up)
    if claimed:
        job_ids = sorted({str(c.job_id) for c in claimed})
        engine.refresh_head()  # a head installed since the last batch is used from this batch on
        references = None
        if engine.drafts_from_text:
            with Session() as session:
                references = lifecycle.earlier_outputs(session, {c.job_id for c in claimed})
        outcomes = decode(engine, claimed, publisher, references)
        written += write_results(Session, outcomes, db_retry_s, owner)
        type_of = {c.id: c.job_type for c in claimed}
        for outcome in outcomes:
            metrics.ITEMS.labels(type_of[outcome.item_id], "failed" if outcome.error else "completed").inc()
        log.info("decoded %d items of %d job(s)", len(claimed), len(job_ids),
                 extra={"job_ids": job_ids, **({"job_id": job_ids[0]} if len(job_ids) == 1 else {}),
                        "items": len(claimed), "written": written})
    for outcome in gave_up:
        metrics.ITEMS.labels("unknown", "failed").inc()
    return written


def write_results(Session, outcomes: list[Outcome], retry_s: float, owner: str | None = None) -> int:
    """lifecycle.record in its own transaction. While Postgres is unreachable, retry with a doubling pause (0.5 s up
    to 8 s) for up to `retry_s`, so a short outage costs no decoding work. Writing is idempotent (one result row per
    item), so a commit whose acknowledgement was lost is harmless to repeat.

    A batch whose write fails for another reason (a value Postgres rejects) is written item by item, and an item that
    still cannot be stored gets an error result instead: one bad result never takes its batch down with it."""
    deadline, pause = time.monotonic() + retry_s, 0.5
    while True:
        try:
            with Session.begin() as session:
                return lifecycle.record(session, outcomes, owner)
        except DB_UNAVAILABLE as exc:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("database unavailable (%s); retrying the write of %d results in %.1f s",
                        exc.__class__.__name__, len(outcomes), pause)
            time.sleep(pause)
            pause = min(pause * 2, 8.0)
        except sa_exc.DBAPIError as exc:
            if len(outcomes) > 1:
                log.warning("writing %d results failed (%s); writing them one by one", len(outcomes),
                            exc.__class__.__name__)
                return sum(write_results(Session, [o], max(0.0, deadline - time.monotonic()), owner)
                           for o in outcomes)
            if outcomes[0].error is not None:
                raise
            log.warning("the result of item %d cannot be stored: %s", outcomes[0].item_id, exc.orig)
            message = f"the result could not be stored: {exc.orig.__class__.__name__}: {exc.orig}"[:2000]
            return write_results(Session, [Outcome(outcomes[0].item_id, error=message)], 0.0, owner)


def decode(engine, items: list[Claimed], publisher=None, references=None) -> list[Outcome]:
    """Items with the same job type, decode params and baseline-sample flag are decoded in one generate() call.
    A group that raises is retried one item at a time, so one bad item fails alone. references: {job id: earlier
    outputs' token ids} for the suffix and hybrid drafters (None: none)."""
    groups: dict[tuple, list[Claimed]] = defaultdict(list)
    for item in items:
        # Stop strings are applied per item after decoding, and streaming is per item: neither splits a batch.
        decode_params = {k: v for k, v in item.params.items() if k not in ("stop", "stream")}
        groups[(item.job_type, item.baseline_sample, json.dumps(decode_params, sort_keys=True))].append(item)
    outcomes = []
    for group in groups.values():
        try:
            refs = [r for job_id in dict.fromkeys(i.job_id for i in group) for r in (references or {}).get(job_id, [])]
            outcomes += decode_group(engine, group, publisher, refs)
        except Exception as exc:  # noqa: BLE001 - isolate, then record the failure on the item
            metrics.FAILURES.labels("item" if len(group) == 1 else "group").inc()
            if len(group) == 1:
                log.warning("item %d failed: %r", group[0].id, exc, extra={"job_id": str(group[0].job_id)})
                outcomes.append(Outcome(group[0].id, error=f"{exc.__class__.__name__}: {exc}"))
            else:
                log.warning("a batch of %d failed (%r); decoding its items one by one", len(group), exc)
                outcomes += [o for item in group for o in decode(engine, [item], publisher, references)]
    return outcomes


def decode_group(engine, group: list[Claimed], publisher=None, references=()) -> list[Outcome]:
    """One generate() call for the group; the job's kind builds each item's input and reads its result."""
    params, kind = group[0].params, kinds.get(group[0].job_type)
    decoder = engine.decoder(params["parallel_degree"], params["validation_threshold"])
    given = [kind.model_input(item, item.options or {}, decoder.score_options) for item in group]
    ids = [engine.chat.encode_messages(g.turns) for g in given]
    spec = generate(engine, decoder, ids, params, speculative=True, on_tokens=stream_to(engine, group, publisher),
                    references=references)
    base = generate(engine, decoder, ids, params, speculative=False) if group[0].baseline_sample else None
    observe(spec, base)
    outcomes = []
    for i, item in enumerate(group):
        result, stats = spec[i]
        output, stats = kind.result(item, given[i], result.text, result.token_ids, stats, engine.target.decode)
        outcomes.append(Outcome(item.id, output=output, stats=stats, baseline_stats=base[i][1] if base else None))
    return outcomes


def stream_to(engine, group: list[Claimed], publisher):
    """generate()'s on_tokens for the group's items that stream (their params say `stream`); None if none does, so
    the decoder runs without a callback."""
    publishers = {i: publisher(item, engine.target.decode) for i, item in enumerate(group)
                  if publisher is not None and item.params.get("stream")}
    if not publishers:
        return None
    return lambda i, tokens: publishers[i].add(tokens) if i in publishers else None


def generate(engine, decoder, ids: list[list[int]], params: dict, speculative: bool, on_tokens=None, references=()):
    """decoder.generate_ids over the prompts' token ids; each item's stats get its share of the call's wall time (by
    new tokens), which is what job throughput is computed from, and its prompt length (usage)."""
    results = decoder.generate_ids(ids, max_new_tokens=params["max_new_tokens"], temperature=params["temperature"],
                                   top_p=params["top_p"], top_k=params["top_k"], batch_size=engine.batch_size,
                                   speculative=speculative, seed=params.get("seed"), references=references,
                                   on_tokens=on_tokens)
    wall = decoder.last_stats["wall_time_s"]
    total = sum(len(r.token_ids) for r in results)
    out = []
    for r, prompt in zip(results, ids):
        share = wall * len(r.token_ids) / total if total else wall / len(results)
        out.append((r, {**r.stats, "finish_reason": r.finish_reason, "batch_items": len(ids),
                        "time_share_s": share, "prompt_tokens": len(prompt), "head_version": engine.head_version}))
    return out


def observe(spec, base) -> None:
    """Batch metrics of one decode group (speculative call, and its baseline if the group was in the sample)."""
    stats = [s for _, s in spec]
    wall = sum(s["time_share_s"] for s in stats)
    tokens = sum(s.get("new_tokens", 0) for s in stats)
    forwards = sum(s.get("target_forwards", 0) for s in stats)
    metrics.BATCH_SIZE.observe(len(spec))
    metrics.BATCH_SECONDS.observe(wall)
    metrics.TOKENS.inc(tokens)
    if wall > 0:
        metrics.TOKENS_PER_S.observe(tokens / wall)
    for s in stats:
        if s.get("rounds"):
            metrics.ACCEPT_LENGTH.observe(s["accept_length"])
    base_wall = sum(s["time_share_s"] for _, s in base) if base else 0.0
    base_tokens = sum(s.get("new_tokens", 0) for _, s in base) if base else 0
    if base and wall > 0 and base_wall > 0 and base_tokens > 0:
        kind, speedup = "measured", (tokens / wall) / (base_tokens / base_wall)
    elif forwards:
        kind, speedup = "estimated", tokens / forwards
    else:
        return
    metrics.SPEEDUP.labels(kind).observe(speedup)
    metrics.LAST_SPEEDUP.labels(kind).set(speedup)
