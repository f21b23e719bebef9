"""The pieces of %%ddp --bg and --peek without a kernel: the pool's queue, the job handle, a cancel as the Ctrl-C it
stands for, the export history of a late cell, the peek desk, the rank's split streams and refused collectives."""
from __future__ import annotations

import asyncio
import concurrent.futures
import io
import threading
import time
from typing import List

import pytest

from ddp_magic.errors import CellError, Dequeued, RankFailure, UsageError
from ddp_magic.export.record import History
from ddp_magic.kernel.cell import CellRun
from ddp_magic.kernel.results.metrics import CellMetrics
from ddp_magic.kernel.jobs.peek import PeekDesk, _outcome
from ddp_magic.kernel.failures.policy import FailurePolicy
from ddp_magic.kernel.pool_status import PoolStatus
from ddp_magic.kernel.ranks import RankInfo
from ddp_magic.kernel.jobs.stdin import CANCELLED, InputDesk, Mailbox, Question, answer_all
from ddp_magic.kernel.jobs.turns import Ticket, Turns, clock_text
from ddp_magic.procs import rank_collectives, rank_peek
from ddp_magic.states import FailureKind, JobState, RankState
from ddp_magic.wire import protocol as P
from ddp_magic.ui.jobs import Job

from test_policy import FakePool


# ------------------------------------------------------------------ the queue
@pytest.mark.parametrize("seconds, text", [(0, "0:00:00"), (7.9, "0:00:07"), (61, "0:01:01"), (3731, "1:02:11"), (-1, "0:00:00")])
def test_a_run_time_reads_as_a_clock(seconds, text):
    assert clock_text(seconds) == text


def test_a_ticket_says_what_the_status_and_the_panel_show():
    t = Ticket("cell [12]", background=True)
    assert t.text() == "background: cell [12] queued"
    t.since = 100.0
    t.progress = lambda: 4120
    assert t.text(now=100.0 + 30) == "background: cell [12] starting, step 4,120" and t.phase == "starting"  # the pool starts
    t.ran = 100.0 + 20  # the cell reached the ranks 20 s after it got the turn: its run time starts there
    assert t.text(now=100.0 + 20 + 3731) == "background: cell [12] running 1:02:11, step 4,120" and t.phase == "running"
    t.ran_for = 28.12  # it ended: the cell's own figure, whatever the clock says now
    assert t.on_ranks(now=1e9) == 28.12
    assert Ticket("cell [3]", since=5.0, ran=5.5).text(now=6.5) == "cell [3] running 0:00:01"


def test_the_job_s_run_clock_starts_when_its_cell_reaches_the_ranks():
    """TicketClock (Session._run) starts the ticket's clock at the ranks' RUNNING, the moment the cell view's run clock
    starts (Pool._send_cell's t0): job.elapsed, the status bar and the cell count the same seconds. The pool tells every
    rank's RUNNING in one on_states; a listener that knows only on_state hears each rank."""
    from ddp_magic.kernel.ranks import Listener
    from ddp_magic.kernel.jobs.turns import TicketClock

    heard: List[RankState] = []

    class Inner(Listener):
        def on_state(self, info: RankInfo) -> None:
            heard.append(info.state)

    ticket = Ticket("cell [3]", True, since=10.0)
    clock = TicketClock(ticket, Inner())
    clock.on_state(RankInfo(0, RankState.STARTING, started=11.0))
    assert ticket.ran is None and ticket.on_ranks(now=30.0) == 0.0
    clock.on_states([RankInfo(0, RankState.RUNNING, started=32.0), RankInfo(1, RankState.RUNNING, started=32.0)])  # as the pool sends a cell
    assert ticket.ran == 32.0 and ticket.on_ranks(now=49.03) == pytest.approx(17.03) and heard == ["starting", "running", "running"]
    job = Job(ticket, lambda j: None)
    assert repr(job).startswith("<Job cell [3]: running ")
    ticket.ran_for = 17.03  # the session gives the cell's own figure once it ended (CellOutcome.elapsed)
    assert job.elapsed == 17.03 and repr(job) == "<Job cell [3]: running 0:00:17>"


def test_cells_take_their_turn_first_come_first_served():
    turns, order = Turns(), []
    first = Ticket("cell [1]", background=True)
    turns.take(first)
    queued = threading.Event()

    def cell(name: str) -> None:
        with turns.turn(Ticket(name), on_queued=lambda holder: queued.set()):
            order.append(name)

    threads = []
    for name in ("cell [2]", "cell [3]"):
        queued.clear()
        threads.append(threading.Thread(target=cell, args=(name,)))
        threads[-1].start()
        assert queued.wait(5)  # in line before the next one comes
    assert turns.waiting() == ["cell [2]", "cell [3]"] and order == []
    turns.give_back(first)
    for t in threads:
        t.join(5)
    assert order == ["cell [2]", "cell [3]"] and turns.holder is None and turns.waiting() == []


def test_no_queue_refuses_at_once_naming_the_running_cell_and_the_ways_out():
    turns = Turns()
    turns.take(Ticket("cell [12]", background=True))
    with pytest.raises(UsageError) as e:
        turns.take(Ticket("cell [13]"), wait=False)
    assert "cell [13] did not run" in str(e.value) and "cell [12] runs on the pool now" in str(e.value) and "job.cancel()" in str(e.value)
    with pytest.raises(UsageError, match="no restart: cell \\[12\\] runs on the pool now"):
        turns.check_idle("no restart")
    assert turns.waiting() == []


def test_a_cancel_or_a_ctrl_c_takes_a_waiting_cell_out_of_the_line():
    turns = Turns()
    holder = Ticket("cell [1]", background=True)
    turns.take(holder)
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(Dequeued, match="cancelled while it waited"):
        turns.take(Ticket("cell [2]", background=True), cancelled=cancelled)

    def ctrl_c(_: Ticket) -> None:
        raise KeyboardInterrupt

    with pytest.raises(Dequeued, match="taken out of the queue \\(Ctrl-C\\)"):
        turns.take(Ticket("cell [3]"), on_queued=ctrl_c)
    assert turns.waiting() == [] and turns.holder is holder
    assert not turns.try_take(Ticket("a peek"))
    turns.give_back(holder)
    peek = Ticket("a peek")
    assert turns.try_take(peek) and turns.holder is peek


def test_the_status_shows_the_job_and_the_line():
    now = time.monotonic()
    status = PoolStatus(started=True, nproc=2, backend="gloo", master_port=1234, job=Ticket("cell [5]", True, since=now, ran=now), queued=("cell [6]",))
    lines = status.text().splitlines()
    assert lines[-2].startswith("background: cell [5] running 0:00:0") and lines[-1] == "queued: cell [6]"


# ------------------------------------------------------------------ a cancel is a Ctrl-C off the main thread
def test_a_cancel_interrupts_the_cell_as_ctrl_c_does():
    pool = FakePool(3, interruptible=[0, 1, 2])
    cancel = threading.Event()
    pool.at(0.7, cancel.set)
    run = CellRun(pool, FailurePolicy(None, pool.grace, 0.0), clock=lambda: pool.now, cancel=cancel)
    run.drive()
    assert pool.did("interrupt") == [("interrupt", (0, 1, 2), pytest.approx(0.71))]
    assert run.job_cancelled and run.user_interrupt and not run.state_lost
    assert run.notes == []  # not "interrupted by the user (Ctrl-C …)": the cancel's own words come from the session
    assert not cancel.is_set()  # taken: a second cancel() is a second Ctrl-C


def test_a_second_cancel_stops_ranks_that_ignore_the_interrupt():
    pool = FakePool(2, term_ok=[0, 1])
    cancel = threading.Event()
    pool.at(0.5, cancel.set)
    pool.at(0.6, cancel.set)
    run = CellRun(pool, FailurePolicy(None, pool.grace, 0.0), clock=lambda: pool.now, cancel=cancel)
    run.drive()
    assert [(f.rank, f.kind) for f in run.failures()] == [(0, "killed"), (1, "killed")]


# ------------------------------------------------------------------ the job handle
def _job(work, live=lambda: None) -> Job:
    ticket = Ticket("cell [9]", background=True)
    return Job(ticket, lambda job: (setattr(ticket, "since", time.monotonic()), setattr(ticket, "ran", time.monotonic()), work(job))[2], live=live)


def test_a_job_gives_its_value_once_it_ended():
    release = threading.Event()
    store = CellMetrics("1")
    job = _job(lambda j: (release.wait(5), [0, 1])[1], live=lambda: store).start()
    assert not job.done() and job.wait(timeout=0.05) is False
    with pytest.raises(TimeoutError, match="cell \\[9\\] still runs after 0.05 s"):
        job.result(timeout=0.05)
    store.add(0, [(41, 0.0, {"loss": 1.0})])
    assert job.metrics == {"rank": [0], "step": [41], "time": [0.0], "loss": [1.0]}
    assert job.wait(0) is False and job.state == JobState.RUNNING
    release.set()
    assert job.wait(5) and job.result() == [0, 1] and job.state == JobState.DONE and not job.cancel()
    ended = job.elapsed
    time.sleep(0.02)
    assert job.elapsed == ended >= 0  # the clock stopped when the job ended
    assert repr(job).startswith("<Job cell [9]: done after 0:00:0")


def test_a_failed_job_raises_the_same_error_each_time_and_await_gives_it_too():
    error = CellError([RankFailure(rank=1, kind=FailureKind.ERROR, type="ValueError", message="no")])
    job = _job(lambda j: (_ for _ in ()).throw(error)).start()
    assert job.wait(5)
    for _ in range(2):
        with pytest.raises(CellError) as e:
            job.result()
        assert e.value is error
    with pytest.raises(CellError):
        _await(job)
    assert job.state == JobState.FAILED and "rank 1 raised ValueError: no" in repr(job)


async def _awaiting(job: Job):
    return await job


def _await(job: Job):
    """``await job`` in an event loop of a thread's own: this process may be running another loop (a browser test's
    Playwright, when the suite runs on workers), and asyncio.run refuses to start inside it."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _awaiting(job)).result(30)


def test_a_cancelled_job_is_cancelled_not_failed():
    def work(job: Job) -> None:
        assert job.cancel_event.wait(5)
        raise CellError([RankFailure(rank=0, kind=FailureKind.INTERRUPTED)], ["interrupted by the user"])

    job = _job(work).start()
    assert job.cancel() is True
    assert job.wait(5) and job.state == JobState.CANCELLED
    assert _await(_job(lambda j: 7).start()) == 7


def test_a_queued_job_says_so():
    job = Job(Ticket("cell [4]", background=True), lambda j: None)
    assert repr(job) == "<Job cell [4]: queued>" and job.state == JobState.QUEUED and job.elapsed == 0.0


# ------------------------------------------------------------------ %ddp_export: a late cell's run goes to its own record
class _Spec:
    nnodes, backend, pg_timeout, init, mesh = 1, "auto", 300.0, True, None


class _Pool:
    spec, nproc, backend = _Spec(), 2, "gloo"


class _Outcome:
    values, ok = [1, 2], True


@pytest.mark.parametrize("ends_first", [False, True])
def test_a_background_cells_run_lands_in_its_own_record(ends_first):
    history = History()
    key = object()
    history.begin_late(key)
    if ends_first:
        history.ran("a = 1", {}, {}, _Pool(), _Outcome(), late=key)
    history.cell(3, "%%ddp --bg\na = 1", True)
    history.cell(4, "print('meanwhile')", True)
    if not ends_first:
        history.ran("a = 1", {}, {}, _Pool(), _Outcome(), late=key)
    history.cell(5, "x = 2", True)
    assert [(c.number, [r.body for r in c.runs]) for c in history.cells] == [(3, ["a = 1"]), (4, []), (5, [])]


# ------------------------------------------------------------------ the peek desk and its outcome
def test_the_desk_files_answers_by_peek_and_rank_and_drops_strays():
    desk = PeekDesk()
    pid = desk.open()
    desk.put(0, {"id": pid, "rank": 0})
    desk.put(1, {"id": pid + 1000, "rank": 1})  # nobody waits for that one
    assert desk.answered(pid, [0]) and not desk.answered(pid, [0, 1])
    threading.Timer(0.05, desk.put, args=(1, {"id": pid, "rank": 1})).start()
    desk.wait(pid, [0, 1], time.monotonic() + 5)
    assert sorted(desk.close(pid)) == [0, 1] and desk.close(pid) == {}


def test_a_peeks_outcome_has_values_where_asked_and_names_who_failed_or_stayed_silent():
    from ddp_magic.wire import transfer

    answers = {
        0: {"result": transfer.pack(41, shm_dir=None), "stdout": "hi\n", "stderr": ""},
        1: {"error": {"type": "ZeroDivisionError", "message": "division by zero", "traceback": "tb"}, "stdout": "", "stderr": "w\n"},
    }
    out = _outcome(4, [0, 1, 2], answers, timeout=2)
    assert out.values == [41, None, None, None] and out.output == {0: ("hi\n", ""), 1: ("", "w\n")}
    assert [(f.rank, f.kind) for f in out.failures] == [(1, FailureKind.ERROR), (2, FailureKind.TIMEOUT)]
    assert out.failures[1].headline() == "rank 2 did not answer the peek within 2 s (its peek thread may still run an earlier peek)"


# ------------------------------------------------------------------ the rank's side
def test_a_peek_threads_prints_are_its_own_and_other_threads_write_through():
    inner = io.StringIO()
    split = rank_peek._Split(inner, "stdout")
    split.write("main 1\n")
    seen: List[str] = []

    def peek() -> None:
        rank_peek._LOCAL.bufs = {"stdout": io.StringIO(), "stderr": io.StringIO()}
        split.write("peek\n")
        split.flush()
        seen.append(rank_peek._LOCAL.bufs["stdout"].getvalue())
        rank_peek._LOCAL.bufs = None

    t = threading.Thread(target=peek)
    t.start()
    t.join()
    split.write("main 2\n")
    assert seen == ["peek\n"] and inner.getvalue() == "main 1\nmain 2\n" and split.getvalue() == inner.getvalue()


def test_a_collective_on_a_refused_thread_raises_and_leaves_the_record_alone():
    calls: List[str] = []
    wrapped = rank_collectives._wrap("all_reduce", lambda *a: calls.append("ran"))
    errors: List[BaseException] = []

    def peek() -> None:
        rank_collectives.refuse(threading.get_ident(), rank_peek.REFUSED)
        try:
            wrapped(1)
        except rank_collectives.CollectiveRefused as e:
            errors.append(e)

    saved = rank_collectives.STATE.refused
    try:
        t = threading.Thread(target=peek)
        t.start()
        t.join()
    finally:
        rank_collectives.STATE.refused = saved  # a later thread may get the same ident
    wrapped(1)  # this thread may
    assert calls == ["ran"] and len(errors) == 1 and str(errors[0]).startswith("a peek may not call torch.distributed.all_reduce:")
    assert rank_collectives.STATE.current is None


def test_a_ctrl_c_as_the_turn_is_granted_does_not_keep_it():
    turns = Turns()
    holder = Ticket("cell [1]", background=True)
    turns.take(holder)
    late = Ticket("cell [2]")
    grant = turns._grant

    def granted_then_interrupted(ticket: Ticket) -> None:
        grant(ticket)
        if ticket is late:
            raise KeyboardInterrupt

    turns._grant = granted_then_interrupted  # type: ignore[method-assign]
    threading.Timer(0.05, turns.give_back, args=(holder,)).start()
    with pytest.raises(Dequeued):
        with turns.turn(late):
            pytest.fail("the body must not run")
    assert turns.holder is None and turns.waiting() == []


# ------------------------------------------------------------------ a background cell's questions (kernel/stdin.Mailbox)
class QuestionHub:
    """The part of the hub a mailbox acts through: the ranks' questions, and what was sent to which rank."""

    def __init__(self) -> None:
        self.stdin = InputDesk()
        self.sent: List[tuple] = []
        self.drained: List[int] = []

    def broadcast(self, msg: dict, ranks=None) -> None:
        self.sent.append((msg, list(ranks or [])))

    def drain_outs(self, rank: int, timeout: float = 0.5) -> None:
        self.drained.append(rank)

    def debug_changed(self, rank: int) -> None:
        pass

    def pump(self, until, deadline) -> bool:
        return until()


def test_a_background_question_is_posted_said_once_answered_from_another_thread_then_sent():
    told: List[str] = []
    routes: List[object] = []
    box = Mailbox(tell=lambda q: told.append(q.text()), reroute=routes.append)
    hub, ranks = QuestionHub(), {0: RankInfo(0, RankState.RUNNING), 1: RankInfo(1, RankState.RUNNING)}
    hub.stdin.request(1, {"id": 3, "prompt": "lr? "})
    for _ in range(2):  # the job's thread wakes twice: the question is posted and said once, nothing is sent
        answer_all(hub, ranks, box, cancelled=False)
    assert told == ["rank 1 waits for input: 'lr? '"] and hub.sent == [] and hub.drained == [1]
    assert box.text() == "rank 1 waits for input: 'lr? '" and box.question(0) is None
    question = box.question()
    assert question is not None and question.rank == 1
    threading.Thread(target=box.answer, args=(question, "0.5")).start()  # a cell answers it (job.answer, %ddp_debug)
    time.sleep(0.05)
    answer_all(hub, ranks, box, cancelled=False)
    assert [(m["op"], m["id"], m["text"], m["eof"], r) for m, r in hub.sent] == [(P.INPUT, 3, "0.5", None, [1])]
    assert box.text() is None and hub.stdin.pending == {} and routes == []


def test_an_attached_cell_gets_the_output_and_no_notice_and_a_cancel_answers_eof():
    told: List[str] = []
    routes: List[object] = []
    box = Mailbox(tell=lambda q: told.append(q.text()), reroute=routes.append)
    hub, ranks = QuestionHub(), {0: RankInfo(0, RankState.RUNNING)}
    box.attach("the debugging cell")
    hub.stdin.request(0, {"id": 1, "prompt": "(Pdb) "})
    hub.stdin.debugger(0, True)
    answer_all(hub, ranks, box, cancelled=False)
    assert routes == ["the debugging cell"] and told == [] and box.text() == "rank 0 waits in the debugger: '(Pdb) '"
    box.detach()
    answer_all(hub, ranks, box, cancelled=True)  # job.cancel(): the rank's wait ends as a foreground cell's would
    assert routes == ["the debugging cell"]  # a cancelled job's output goes nowhere new (its thread ends)
    assert hub.sent[-1][0]["eof"] == CANCELLED and box.text() is None and box.closed


def test_next_question_waits_while_the_rank_sits_in_pdb_and_gives_up_after_it_left():
    box = Mailbox()
    hub, ranks = QuestionHub(), {0: RankInfo(0, RankState.RUNNING)}
    hub.stdin.request(0, {"id": 1, "prompt": "(Pdb) "})
    hub.stdin.debugger(0, True)
    answer_all(hub, ranks, box, cancelled=False)
    first = box.question()
    assert first is not None
    box.answer(first, "n")
    answer_all(hub, ranks, box, cancelled=False)  # sent; the rank steps and asks again
    hub.stdin.request(0, {"id": 2, "prompt": "(Pdb) "})
    threading.Timer(0.1, answer_all, args=(hub, ranks, box, False)).start()
    second = box.next_question(first, settle=0.0, timeout=5)
    assert second is not None and second.id == 2
    box.answer(second, "c")
    hub.stdin.debugger(0, False)
    answer_all(hub, ranks, box, cancelled=False)  # sent, and the rank left pdb
    assert box.next_question(second, settle=0.05, timeout=5) is None


def test_a_job_says_what_its_rank_waits_for_and_answer_refuses_a_rank_that_does_not_ask():
    ticket = Ticket("cell [4]", background=True)
    gate = threading.Event()
    job = Job(ticket, lambda j: gate.wait(10)).start()
    ticket.since = ticket.ran = time.monotonic()
    job.mailbox._post(Question(0, 9, "name? ", False, False))
    assert job.waiting == "rank 0 waits for input: 'name? '"
    assert repr(job).endswith("; rank 0 waits for input: 'name? ' (%ddp_debug answers)>")
    assert ticket.text().endswith("; rank 0 waits for input: 'name? ' (%ddp_debug answers)")
    with pytest.raises(UsageError, match="job.answer: rank 1 of cell \\[4\\] waits for input now"):
        job.answer("x", rank=1)
    assert job.answer("Ada") == "rank 0 waits for input: 'name? '" and job.mailbox.question() is None
    gate.set()
    job.wait(10)
    assert job.waiting is None and job.mailbox.closed
