"""The deployment's completed greedy generation items as token ids: the training data of eagle3.adapt.

Torch-free, like the rest of jobs/. Only items decoded at temperature 0 with strict verification qualify: their
outputs are the target's own greedy tokens (the adapter still checks that against the target's argmax)."""
from __future__ import annotations

import uuid
from typing import NamedTuple

from sqlalchemy import Float, select
from sqlalchemy.orm import Session

from . import tokenizer
from .models import Item, ItemResult, Job


class GreedyItem(NamedTuple):
    item_id: int
    prompt_ids: list[int]  # encoded exactly as the worker encoded them (jobs/tokenizer.py)
    output_ids: list[int]


def greedy_items(session: Session, chat, job_ids=(), last: int | None = None) -> list[GreedyItem]:
    """The completed greedy generation items of `job_ids` (all jobs when empty), the most recently finished
    `last` of them when given, in item id order."""
    query = (select(Item.id, Item.prompt, Item.messages, ItemResult.output)
             .join(ItemResult, ItemResult.item_id == Item.id).join(Job, Job.id == Item.job_id)
             .where(Job.type == "generation", Item.status == "completed", ItemResult.output.is_not(None),
                    Item.params["temperature"].astext.cast(Float) == 0,
                    Item.params["validation_threshold"].astext.cast(Float) == 1)
             .order_by(Item.finished_at.desc(), Item.id.desc()))
    if job_ids:
        query = query.where(Item.job_id.in_([uuid.UUID(str(j)) for j in job_ids]))
    if last:
        query = query.limit(last)
    rows = sorted(session.execute(query).all(), key=lambda row: row.id)
    return [GreedyItem(row.id, chat.encode_messages(tokenizer.turns(row.prompt, row.messages)),
                       list(row.output["token_ids"])) for row in rows if row.output.get("token_ids")]
