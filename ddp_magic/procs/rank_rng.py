"""A rank's random states (torch, CUDA, numpy's global one, ``random``'s): saved per rank in a snapshot, set again by a
load at the same world size and by a heal from the last snapshot, so the next random number is the one the pool would
have drawn."""
from __future__ import annotations

import random
from typing import Any, Dict

import torch

from ..logs import log


def rng_state() -> Dict[str, Any]:
    """This rank's random states: torch (CPU, and CUDA where initialised), numpy's global one, ``random``'s."""
    state: Dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        log.debug("numpy is not installed: no numpy RNG state to save")
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["random"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
