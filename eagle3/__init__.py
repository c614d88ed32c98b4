"""EAGLE-3 speculative decoding: a draft head on the target's low/mid/high hidden states drafts a token tree that
the target verifies in one forward pass. Lossless at temperature 0 (token-identical) and under sampling."""
from .target import DEFAULT_TARGET, Target, load_target, load_tokenizer
from .draft import Eagle3Head, HeadConfig
from .decoder import GenerationResult, SpeculativeDecoder
from .adopt import target_from_hf

__all__ = ["SpeculativeDecoder", "GenerationResult", "Eagle3Head", "HeadConfig", "Target", "load_target",
           "DEFAULT_TARGET", "load_tokenizer", "target_from_hf"]
