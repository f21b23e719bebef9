"""A passing holder of the pool's turn (an armed pool's watcher pumping the hub between cells, ui/preempt.py) is no cell:
``%ddp stop``, restart, ``%ddp_env`` and the others that need an idle pool wait for its slice instead of being refused
(they were, every time, on an idle pool armed with --save-on-preempt), and it stays away while they run."""
from __future__ import annotations

import threading
import time

import pytest

from ddp_magic.errors import UsageError
from ddp_magic.kernel.jobs.turns import Ticket, Turns


def _hold(turns: Turns, ticket: Ticket, seconds: float) -> threading.Thread:
    assert turns.try_take(ticket)
    thread = threading.Thread(target=lambda: (time.sleep(seconds), turns.give_back(ticket)))
    thread.start()
    return thread


def test_check_idle_waits_for_a_passing_holder_then_keeps_it_away_until_a_cell_came_and_went() -> None:
    turns, watcher = Turns(), Ticket("--save-on-preempt", passing=True)
    thread = _hold(turns, watcher, 0.3)
    turns.check_idle("the pool was not stopped")  # no UsageError: the watcher's slice ended
    thread.join()
    assert turns.holder is None
    assert not turns.try_take(watcher), "the watcher stays away while the command runs"
    with turns.turn(Ticket("cell [3]")):
        pass
    assert turns.try_take(watcher), "once a cell's turn came and went, it pumps between cells again"


def test_a_cell_holding_the_turn_still_refuses() -> None:
    turns = Turns()
    assert turns.try_take(Ticket("cell [4]", background=True))
    with pytest.raises(UsageError, match=r"the pool was not stopped: cell \[4\] runs on the pool now"):
        turns.check_idle("the pool was not stopped")
