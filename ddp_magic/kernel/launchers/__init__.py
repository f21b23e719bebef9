"""How rank processes come to exist: a fork server (fast), plain spawn (portable), torchrun (several nodes), Slurm job steps or SSH sessions.

All five implement ``Launcher`` (base.py); the pool reads its capability
flags and never asks which one it has. ``make_launcher`` picks one from the
start method.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, List, Tuple

from .base import Exit, LaunchError, Launcher, LocalLauncher, signal_pid, worker_env
from .forkserver import ForkServerLauncher
from .ray import RayLauncher, preview as ray_preview
from .slurm import SlurmLauncher, preview as slurm_preview
from .spawn import SpawnLauncher
from .ssh import SshLauncher
from .ssh_probe import preview as ssh_preview

if TYPE_CHECKING:
    from ...plan.check import Check
    from ...plan.plan import Plan
from .torchrun import TorchrunLauncher


def make_launcher(method: str, secret: bytes) -> Launcher:
    """The launcher for a start method: auto is the fork server on Linux, spawn elsewhere."""
    if method == "torchrun":
        return TorchrunLauncher(secret)
    if method == "slurm":
        return SlurmLauncher(secret)
    if method == "ssh":
        return SshLauncher(secret)
    if method == "ray":
        return RayLauncher(secret)
    if method == "auto":
        method = "fork" if sys.platform.startswith("linux") else "spawn"
    if method == "fork":
        return ForkServerLauncher(secret)
    if method == "spawn":
        return SpawnLauncher(secret)
    raise ValueError(f"unknown start method {method!r}; use auto, fork, spawn or torchrun")


def preview(plan: "Plan") -> "Tuple[Plan, List[Check]]":
    """What %ddp_env shows of where the ranks would run, nothing started: Slurm's verdict (kernel/launchers/slurm.py),
    each host asked over ssh (ssh_probe.py), or nothing to ask for one host."""
    if plan.slurm is not None:
        return slurm_preview(plan)
    if plan.ssh is not None:
        return ssh_preview(plan)
    if plan.ray is not None:
        return ray_preview(plan)
    return plan, []


__all__ = [
    "Exit", "ForkServerLauncher", "LaunchError", "Launcher", "LocalLauncher", "RayLauncher",
    "SlurmLauncher", "SpawnLauncher", "SshLauncher", "TorchrunLauncher", "make_launcher", "preview", "signal_pid", "worker_env",
]
