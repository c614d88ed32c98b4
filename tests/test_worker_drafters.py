"""The worker's DRAFTER setting: with the suffix drafter a batch drafts from its job's earlier outputs (read from
Postgres as references), which speeds up items that repeat them and changes no output."""
import pytest
from conftest import RUN_ID, client_for, submit
from sqlalchemy import select

from api import create_app
from jobs.db import session_factory
from jobs.models import Item, ItemResult
from worker import processing
from worker.engine import Engine


def test_a_batch_drafts_from_the_jobs_earlier_outputs(database):
    Session = session_factory(database)
    idle = client_for(create_app({"queue": f"unconsumed-{RUN_ID}"}))  # nothing else decodes its items
    same = {"prompt": "Tell me about the quick brown fox and the lazy dog."}
    job = submit(idle, {"items": [{"custom_id": "first", **same}, {"custom_id": "again", **same}],
                        "params": {"max_new_tokens": 48}})
    with Session() as session:
        first, again = session.scalars(select(Item.id).where(Item.job_id == job["id"]).order_by(Item.idx)).all()
    engine = Engine("tiny", batch_size=8, drafter="suffix")
    engine.decoder(4, 1.0).budget = None  # the job's decoder verifies every suffix draft (no budget to skip one)
    assert processing.process(Session, engine, [first], max_attempts=3) == 1  # no earlier output yet
    assert processing.process(Session, engine, [again], max_attempts=3) == 1  # drafts from the first one's
    with Session() as session:
        a, b = (session.get(ItemResult, i) for i in (first, again))
    assert b.output["token_ids"] == a.output["token_ids"] and len(a.output["token_ids"]) > 16
    assert b.stats["accept_length"] > a.stats["accept_length"] + 1.5, (a.stats, b.stats)


def test_an_unknown_drafter_stops_the_worker_at_start():
    with pytest.raises(ValueError, match="DRAFTER"):
        Engine("tiny", batch_size=8, drafter="nope")
