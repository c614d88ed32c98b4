"""The decoder, loaded once per worker process (eagle3 is imported here only, and only when first needed, so a
prefork parent never touches torch before forking)."""
from __future__ import annotations

import logging
import threading
import time

from jobs import tokenizer

log = logging.getLogger(__name__)
WARM_UP_TOKENS = 64  # per prompt of the warm-up batch: enough rounds for the draft budget to measure its arms


class Engine:
    """A target and its SpeculativeDecoders, one per (parallel_degree, validation_threshold), all on one version of
    the draft head (eagle3/heads.py): `refresh_head` moves them to a newly installed version between batches."""

    def __init__(self, target_name: str, batch_size: int, drafter: str = "eagle"):
        from eagle3 import load_target
        from eagle3.drafters import DRAFTERS

        if drafter not in DRAFTERS:  # a typo in DRAFTER fails the worker's start, not every batch
            raise ValueError(f"DRAFTER={drafter!r}: expected one of {', '.join(DRAFTERS)}")
        self.drafter = drafter
        self.drafts_from_text = drafter in ("suffix", "hybrid")  # they read the job's earlier outputs
        started = time.perf_counter()
        self.target = load_target(target_name)
        self.chat = tokenizer.load(target_name)  # items -> token ids, exactly as the API counted them
        self.batch_size = batch_size
        self._decoders: dict = {}
        self._lock = threading.Lock()
        self.head_version, self._head_stamp = None, None
        self.refresh_head()
        log.info("loaded target %s (context %d) in %.1f s", target_name, self.target.max_context,
                 time.perf_counter() - started)

    def refresh_head(self) -> bool:
        """Called before every batch. When `current` was replaced (an adapter installed a head, or a rollback), the
        decoders are dropped and rebuilt on the version it now names: workers follow without a restart. Unchanged
        pointer: one stat. Returns whether the version changed."""
        from eagle3 import heads

        root = heads.head_root(self.target.name)
        stamp = heads.pointer_stamp(root)
        if stamp == self._head_stamp and self.head_version is not None:
            return False
        version = heads.current_version(root)
        self._head_stamp = stamp
        if version == self.head_version:
            return False
        with self._lock:
            # New decoders, not just a new head: each decoder's speculation policy measured τ with the old head.
            self._decoders.clear()
            self.head_version = version
        log.info("draft head version %d (%s)", version, root)
        return True

    def decoder(self, parallel_degree: int, validation_threshold: float):
        from eagle3 import SpeculativeDecoder
        from eagle3.decoder import head_of_version

        key = (parallel_degree, validation_threshold)
        with self._lock:
            if key not in self._decoders:
                # The version item stats record, explicitly: `current` may name another one by now.
                draft = head_of_version(self.target, self.head_version)
                self._decoders[key] = SpeculativeDecoder(self.target, draft=draft, parallel_degree=parallel_degree,
                                                         validation_threshold=validation_threshold,
                                                         drafter=self.drafter)
            return self._decoders[key]

    def warm_up(self, parallel_degree: int = 4, validation_threshold: float = 1.0) -> None:
        """A batch through both paths, so the first real batch does not pay one-time costs: compiled steps, and the
        draft budget's first measurements. A fresh budget tries its arms (plain steps and draft depths) for a few
        rounds each before it settles (eagle3/budget.py), which a first job paid for where trees do not pay (the
        demo's sample speedup on the AVX512 EPYC at batch 8: 0.84-0.87x before this batch, 0.90x with it); here those
        rounds run on built-in training prompts, and jobs start from what they measured (re-checked as jobs run)."""
        from eagle3.prompts import training_prompts

        decoder = self.decoder(parallel_degree, validation_threshold)
        decoder.warm_up(self.batch_size)  # every tree size's compiled steps, not only those two batches reach
        prompts = [p["prompt"] for p in training_prompts(self.batch_size)]
        started = time.perf_counter()
        decoder.generate(prompts, max_new_tokens=WARM_UP_TOKENS, batch_size=self.batch_size)
        decoder.generate(prompts, max_new_tokens=2, batch_size=self.batch_size, speculative=False)
        log.info("warm-up batch: %.1f s, draft budget %s", time.perf_counter() - started,
                 decoder.budget.summary() if decoder.budget else "off")


_engine: Engine | None = None
_engine_lock = threading.Lock()


def get_engine() -> Engine:
    global _engine
    with _engine_lock:
        if _engine is None:
            from jobs.config import get_settings

            settings = get_settings()
            engine = Engine(settings.target, settings.batch_size, settings.drafter)
            engine.warm_up()
            _engine = engine
        return _engine
