"""A kept Ray pool's node placed again hears the keep in force (kernel/launchers/ray_keep.py): the keep and follow lines
the kernel wrote are remembered, in the form its step writes them, and given to the new template alone."""
from __future__ import annotations

from typing import List

from ddp_magic.kernel.launchers.ray import RayLauncher


class Step:
    """A driver step that records what every template would hear."""

    def __init__(self) -> None:
        self.secret = b"s" * 32
        self.sent: List[dict] = []

    def command(self, cmd: dict) -> None:
        self.sent.append(self.wire_form(cmd))

    def wire_form(self, cmd: dict) -> dict:
        cmd.pop("secret", None)  # the step's own secret: the template has it already
        return cmd


def _launcher() -> "tuple[RayLauncher, Step]":
    launcher = RayLauncher(b"s" * 32)
    step = Step()
    launcher.steps = [step]  # type: ignore[list-item]
    launcher.placed_nodes = [{"name": "n1"}, {"name": "n2"}]
    return launcher, step


def test_not_kept_nothing_more() -> None:
    launcher, step = _launcher()
    assert launcher.kept_again(step, 1) == []  # type: ignore[arg-type]


def test_kept_the_keep_and_follow_lines_for_a_follower_placed_again() -> None:
    launcher, step = _launcher()
    launcher._write({"op": "keep", "id": "ab", "node": "n1", "idle": 0, "secret": "00"})
    launcher._write({"op": "follow", "node": "n1", "id": "ab", "lease": {"host": "h"}, "dir": "d", "secret": "00"})
    launcher.lease_lock = "/tmp/lock"
    again = launcher.kept_again(step, 1)  # type: ignore[arg-type]
    assert [c["op"] for c in again] == ["keep", "follow"] and all("secret" not in c for c in again), again
    assert launcher.kept_again(step, 0) == [], "the lease holder's node: the lease went with it"  # type: ignore[arg-type]
    launcher._write({"op": "keep", "id": "ab", "node": "n1", "idle": 5})  # keep again, new timers: the follow stays
    assert [c["op"] for c in launcher.kept_again(step, 1)] == ["keep", "follow"]  # type: ignore[arg-type]
    assert launcher.kept_again(step, 1)[0]["idle"] == 5  # type: ignore[arg-type]
    launcher._write({"op": "unkeep"})
    assert launcher.kept_again(step, 1) == []  # type: ignore[arg-type]
