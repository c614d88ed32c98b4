"""The decoder, loaded once per worker process (eagle3 is imported here only, and only when first needed, so a
prefork parent never touches torch before forking)."""
from __future__ import annotations

import logging
import threading
import time

from jobs import tokenizer

log = logging.getLogger(__name__)


class Engine:
    """A target and its SpeculativeDecoders, one per (parallel_degree, validation_threshold)."""

    def __init__(self, target_name: str, batch_size: int):
        from eagle3 import load_target

        started = time.perf_counter()
        self.target = load_target(target_name)
        self.chat = tokenizer.load(target_name)  # items -> token ids, exactly as the API counted them
        self.batch_size = batch_size
        self._decoders: dict = {}
        self._lock = threading.Lock()
        log.info("loaded target %s (context %d) in %.1f s", target_name, self.target.max_context,
                 time.perf_counter() - started)

    def decoder(self, parallel_degree: int, validation_threshold: float):
        from eagle3 import SpeculativeDecoder

        key = (parallel_degree, validation_threshold)
        with self._lock:
            if key not in self._decoders:
                self._decoders[key] = SpeculativeDecoder(self.target, draft=None, parallel_degree=parallel_degree,
                                                         validation_threshold=validation_threshold)
            return self._decoders[key]

    def warm_up(self, parallel_degree: int = 4, validation_threshold: float = 1.0) -> None:
        """One small batch through both paths, so the first real batch does not pay one-time costs."""
        decoder = self.decoder(parallel_degree, validation_threshold)
        for speculative in (True, False):
            decoder.generate(["Hello"] * self.batch_size, max_new_tokens=2, batch_size=self.batch_size,
                             speculative=speculative)


_engine: Engine | None = None
_engine_lock = threading.Lock()


def get_engine() -> Engine:
    global _engine
    with _engine_lock:
        if _engine is None:
            from jobs.config import get_settings

            settings = get_settings()
            engine = Engine(settings.target, settings.batch_size)
            engine.warm_up()
            _engine = engine
        return _engine
