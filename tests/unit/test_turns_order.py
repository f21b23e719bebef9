"""A --bg cell's place in the pool's line is its cell's, not its thread's: the job's thread takes its turn whenever it
runs, and a cell run right after the --bg cell waits behind it (fc20: a ``%ddp save`` right after a ``--bg`` cell ran
before the job, on a loaded machine). A job that ends before its turn gives its place up."""
from __future__ import annotations

import threading
import time

import pytest

from ddp_magic.errors import UsageError
from ddp_magic.kernel.jobs.turns import Ticket, Turns


def test_a_reserved_ticket_goes_first_however_late_its_thread_takes_it() -> None:
    turns, job, after = Turns(), Ticket("cell [5]", background=True), Ticket("cell [6]")
    turns.reserve(job)  # the --bg cell ran; its thread has not yet
    order: list = []

    def next_cell() -> None:
        with turns.turn(after):
            order.append("cell [6]")

    later = threading.Thread(target=next_cell)
    later.start()
    time.sleep(0.2)
    assert order == [] and turns.waiting() == ["cell [5]", "cell [6]"], "the next cell waits behind the job"
    with turns.turn(job) as waited:  # the job's thread, late
        assert waited == 0.0 and turns.holder is job
        order.append("cell [5]")
    later.join(5)
    assert order == ["cell [5]", "cell [6]"]


def test_a_reserved_ticket_behind_a_running_cell_and_one_withdrawn() -> None:
    turns, running, job, gone = Turns(), Ticket("cell [1]"), Ticket("cell [2]", background=True), Ticket("cell [3]", background=True)
    assert turns.try_take(running)
    turns.reserve(job)
    with pytest.raises(UsageError, match=r"cell \[1\] runs on the pool now"):
        turns.take(job, wait=False)  # --no-queue: refused, its place given up
    assert turns.waiting() == []
    turns.reserve(gone)
    turns.withdraw(gone)  # its job ended before its turn
    turns.reserve(job)
    threading.Timer(0.2, turns.give_back, args=(running,)).start()
    assert turns.take(job) > 0.1 and turns.holder is job and turns.waiting() == []


def test_a_command_that_needs_the_pool_idle_sees_the_job_whose_thread_is_late() -> None:
    """``%ddp stop`` (or a save's wait for a safe point) right after a --bg cell: the job's turn, once its thread took it."""
    turns, job = Turns(), Ticket("cell [7]", background=True)
    turns.reserve(job)
    threading.Timer(0.3, turns.take, args=(job,)).start()
    with pytest.raises(UsageError, match=r"the pool was not stopped: cell \[7\] runs on the pool now"):
        turns.check_idle("the pool was not stopped")
    assert turns.settled(1.0) is job
