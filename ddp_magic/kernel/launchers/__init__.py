"""How rank processes come to exist: a fork server (fast), plain spawn (portable), torchrun (several nodes) or Slurm job steps.

All four implement ``Launcher`` (base.py); the pool reads its capability
flags and never asks which one it has. ``make_launcher`` picks one from the
start method.
"""
from __future__ import annotations

import sys

from .base import Exit, LaunchError, Launcher, LocalLauncher, signal_pid, worker_env
from .forkserver import ForkServerLauncher
from .slurm import SlurmLauncher
from .spawn import SpawnLauncher
from .torchrun import TorchrunLauncher


def make_launcher(method: str, secret: bytes) -> Launcher:
    """The launcher for a start method: auto is the fork server on Linux, spawn elsewhere."""
    if method == "torchrun":
        return TorchrunLauncher(secret)
    if method == "slurm":
        return SlurmLauncher(secret)
    if method == "auto":
        method = "fork" if sys.platform.startswith("linux") else "spawn"
    if method == "fork":
        return ForkServerLauncher(secret)
    if method == "spawn":
        return SpawnLauncher(secret)
    raise ValueError(f"unknown start method {method!r}; use auto, fork, spawn or torchrun")


__all__ = [
    "Exit", "ForkServerLauncher", "LaunchError", "Launcher", "LocalLauncher",
    "SlurmLauncher", "SpawnLauncher", "TorchrunLauncher", "make_launcher", "signal_pid", "worker_env",
]
