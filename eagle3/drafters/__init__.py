"""Drafters by name (`SpeculativeDecoder(..., drafter=NAME)`); the interface is in base.py. A new drafter is one
file here and one line below."""
from .eagle import EagleDrafter
from .hybrid import HybridDrafter
from .suffix import SuffixDrafter

DRAFTERS = {"eagle": EagleDrafter, "suffix": SuffixDrafter, "hybrid": HybridDrafter}
