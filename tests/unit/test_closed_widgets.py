"""A closed status view's widgets take the browser's late messages quietly (ui/status_display.py ``_Closed``).

The kernel-level story (a real kernel, the browser's messages sent while the cell runs) is
tests/kernel/test_lab_comm.py::test_the_live_view_s_widgets_take_the_browser_s_late_messages_quietly; here the comm
manager's own handlers meet the stand-ins, and the stand-ins stay few.
"""
from __future__ import annotations

import logging
from typing import Any, Iterator

import comm
import pytest

from ddp_magic.ui import status_display
from ddp_magic.ui.status_display import _Closed


@pytest.fixture()
def manager(monkeypatch: Any) -> Iterator[Any]:
    m = comm.base_comm.CommManager()
    monkeypatch.setattr(comm, "get_comm_manager", lambda: m)
    monkeypatch.setattr(_Closed, "_kept", status_display.deque())
    yield m


def _msg(comm_id: str, kind: str = "comm_msg") -> dict:
    return {"header": {"msg_type": kind}, "content": {"comm_id": comm_id, "data": {"method": "update", "state": {"index": 1}}}}


def test_a_late_message_for_a_closed_widget_is_no_warning(manager: Any, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    manager.comm_msg(None, None, _msg("gone-before"))
    assert "No such comm: gone-before" in caplog.text  # what the kernel logged before: JupyterLab's log console shows it
    caplog.clear()
    _Closed.stand_in("closed-1")
    manager.comm_msg(None, None, _msg("closed-1"))
    manager.comm_close(None, None, _msg("closed-1", "comm_close"))  # the browser closing it too: gone for good
    assert "closed-1" not in manager.comms
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "late message for closed widget closed-1 dropped" in caplog.text


def test_the_stand_ins_are_few_and_never_a_widget_to_restore(manager: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(_Closed, "KEPT", 3)
    for i in range(5):
        _Closed.stand_in(f"c{i}")
    assert sorted(manager.comms) == ["c2", "c3", "c4"]  # the oldest went: their messages were handled long ago
    # a page that reloads asks comm_info for jupyter.widget to restore widgets: a stand-in is not one
    assert all(c.target_name != "jupyter.widget" for c in manager.comms.values())
