"""Drafters by name (`SpeculativeDecoder(..., drafter=NAME)`); the interface is in base.py. A new drafter is one
file here and one line below."""
from .eagle import EagleDrafter

DRAFTERS = {"eagle": EagleDrafter}
