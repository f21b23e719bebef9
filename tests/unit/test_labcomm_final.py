"""The JupyterLab bridge's snapshots (ui/labcomm.py) with fake comms: a cell's end always reaches the front end.

The race this pins: a throttled snapshot sent a moment before the cell ended already shows its
last state, so the final one has the same content; it must still be sent (the panel stops its
clock on ``final``), while a cell that changed nothing still sends nothing.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, List

from ddp_magic.session import Session
from ddp_magic.ui import labcomm


class FakeComm:
    def __init__(self) -> None:
        self.sent: List[dict] = []

    def send(self, data: dict) -> None:
        self.sent.append(data)


def _bridge() -> Any:
    events = SimpleNamespace(register=lambda name, fn: None)
    manager = SimpleNamespace(register_target=lambda name, fn: None, register_comm=lambda comm: None)
    bridge = labcomm.LabBridge(SimpleNamespace(events=events), Session(), manager)
    comm = FakeComm()
    bridge.comms["c"] = comm
    return bridge, comm


def test_a_final_snapshot_is_sent_even_when_a_throttled_one_showed_the_same_state() -> None:
    bridge, comm = _bridge()
    for _cell in range(2):  # a cell, and the same cell run again
        bridge._broadcast(final=False)  # the throttle's last send, while the cell ends
        bridge.publish(final=True)  # post_run_cell: nothing changed since, yet the cell's end is news
        assert [m["final"] for m in comm.sent[-2:]] == [False, True], comm.sent
        assert comm.sent[-2]["pool"] == comm.sent[-1]["pool"]


def test_a_cell_that_changes_nothing_sends_no_second_final() -> None:
    bridge, comm = _bridge()
    bridge.publish(final=True)
    count = len(comm.sent)
    for _cell in range(2):  # plain cells after it: nothing new, nothing sent
        bridge.publish(final=True)
        assert len(comm.sent) == count
