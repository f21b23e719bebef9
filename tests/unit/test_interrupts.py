"""Who interrupted a queued cell: the DDP panel's Interrupt says so first, over the comm; else Ctrl-C."""
from __future__ import annotations


import pytest
from ddp_magic.errors import Dequeued
from ddp_magic.kernel import interrupts
from ddp_magic.kernel.jobs.turns import Ticket, Turns


def test_the_panels_word_counts_once() -> None:
    assert interrupts.how() == "(Ctrl-C)"
    interrupts.from_panel()
    assert interrupts.how() == "by the DDP panel's Interrupt"
    assert interrupts.how() == "(Ctrl-C)"  # the next interrupt is a key again


def test_a_queued_cell_taken_out_names_the_panel() -> None:
    turns = Turns()
    first, second = Ticket("cell [1]"), Ticket("cell [2]")
    turns.take(first)

    def interrupt(_holder: object) -> None:  # as the kernel's SIGINT lands while the ticket waits
        interrupts.from_panel()
        raise KeyboardInterrupt

    with pytest.raises(Dequeued, match=r"cell \[2\] was taken out of the queue by the DDP panel's Interrupt before it ran; cell \[1\] goes on"):
        turns.take(second, on_queued=interrupt)
