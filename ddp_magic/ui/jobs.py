"""A background %%ddp cell (``%%ddp --bg``): the job that runs it on a kernel thread, and the handle the notebook holds.

The cell is the same run as in the foreground (magics.py), owned by a ``Job`` instead of
the caller's stack. Its thread starts in a copy of the starting cell's context
(``contextvars``): ipykernel keeps the parent header of stdout, stderr, displays and
comms in context variables, so everything the run produces (rank output, the status
view, the chart, update_display, the final error) carries the header of the cell that
started it and lands in that cell's output while other cells run. The job holds the
pool's turn while it runs (kernel/jobs/turns.py): a second %%ddp cell waits behind it.
Ctrl-C reaches the kernel's main thread only, so it never interrupts a job; ``cancel()``
does, the way Ctrl-C interrupts a foreground cell (ranks released, group re-formed, state kept).
"""
from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
import time
from typing import Any, Callable, Dict, Generator, List, Optional, Sequence, Tuple

from ..errors import CellError, Dequeued, JobCancelled, UsageError
from ..kernel.memory import peak_text, range_text
from ..kernel.results.metrics import CellMetrics
from ..kernel.jobs.peek import PeekOutcome
from ..kernel.jobs.stdin import Mailbox
from ..kernel.jobs.turns import Ticket, clock_text
from ..logs import log
from ..states import JobState
from .output import RankPrinter
from .results import RankResults

WAIT_SLICE_S = 0.2  # wait() wakes this often (a Ctrl-C lands at once anyway)
HELD_SLICE_S = 0.005  # start(held=True) looks this often whether the cell reached the ranks (a few ms after the start)
PEEK_ONLY = "the peek failed on these ranks only; the running cell goes on (a peek's error costs only the peek)"


class Job:
    """The handle of one background cell: ``done()``, ``wait()``, ``result()``, ``cancel()``, ``metrics``, ``elapsed``, ``await job``."""

    def __init__(self, ticket: Ticket, work: Callable[["Job"], Any], live: Callable[[], Optional[CellMetrics]] = lambda: None,
                 mailbox: Optional[Mailbox] = None) -> None:
        self.ticket = ticket
        self.mailbox = mailbox if mailbox is not None else Mailbox()  # its ranks' input() and pdb questions (kernel/jobs/stdin.py)
        ticket.waiting = self.mailbox.text
        self.cancel_event = threading.Event()  # the run takes it as a Ctrl-C (kernel/cell.py); the queue as a way out
        self._work = work
        self._live = live  # the running cell's metrics store (its chart's)
        self._done = threading.Event()
        self._state: Optional[JobState] = None  # set once it ended
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._cancelled = False
        self.final_metrics: Optional[Dict[str, List[Any]]] = None
        self.thread: Optional[threading.Thread] = None
        self._on_end: Optional[Callable[[], None]] = None

    def start(self, held: bool = False, on_end: Optional[Callable[[], None]] = None) -> "Job":
        """Run the work on its own thread, in a copy of this (the starting cell's) context. ``held`` (``--keep``): return
        once the cell has reached the ranks (or the job ended), so that a kernel killed right after its cell returned
        leaves the job running on the kept pool, not lost with the kernel's thread before it sent it. ``on_end``: called
        on that thread as the job ends, however (its reserved place in the pool's line given up: kernel/jobs/turns.py)."""
        self._on_end = on_end
        ctx = contextvars.copy_context()
        self.thread = threading.Thread(target=ctx.run, args=(self._run,), name=f"ddp-job {self.ticket.name}", daemon=True)
        self.thread.start()
        while held and self.ticket.ran is None and not self.wait(HELD_SLICE_S):
            pass  # a Ctrl-C stops the waiting (wait() says so), not the job
        return self

    def _run(self) -> None:
        try:
            self._value = self._work(self)
            self._state = JobState.DONE
        except BaseException as e:  # the job's outcome: kept for result(), shown in its own cell
            log.debug("background %s ended with %s", self.ticket.name, type(e).__name__, exc_info=True)
            self._error = e
            self._state = JobState.CANCELLED if self._cancelled and isinstance(e, (CellError, Dequeued)) else JobState.FAILED
            show_error(e)
        finally:
            if self._on_end is not None:
                self._on_end()
            self.mailbox.close()
            if self.ticket.ran_for is None:  # it ended before its cell's outcome gave the figure (a start that failed)
                self.ticket.ran_for = self.ticket.on_ranks()
            self._done.set()

    # ------------------------------------------------------------ asking
    @property
    def state(self) -> JobState:
        if self._state is not None and self._done.is_set():
            return self._state
        return JobState.RUNNING if self.ticket.since is not None else JobState.QUEUED

    def done(self) -> bool:
        """Whether the job has ended (done, failed or cancelled); never waits."""
        return self._done.is_set()

    @property
    def elapsed(self) -> float:
        """Seconds it has run on the ranks (0 while queued or while the pool starts), up to its end: its cell's own
        run time (the status view's clock, its final ``✓ 28.12 s``), the one every view of the job counts."""
        return self.ticket.on_ranks()

    @property
    def metrics(self) -> Dict[str, List[Any]]:
        """What the ranks have logged with ``ddp_magic.log`` so far, as columns (``%ddp metrics``' form)."""
        if self.final_metrics is not None:
            return self.final_metrics
        store = self._live()
        return store.columns() if store is not None else {"rank": [], "step": [], "time": []}

    @property
    def waiting(self) -> Optional[str]:
        """What its ranks wait on the notebook for (``rank 0 waits for input: 'lr? '``), or None; ``%ddp_debug`` answers."""
        return self.mailbox.text() if not self._done.is_set() else None

    def answer(self, text: str, rank: Optional[int] = None) -> str:
        """Answer the question of ``rank`` (default: the lowest rank asking) with ``text``; returns what was answered."""
        question = self.mailbox.question(rank)
        if question is None:
            who = f"rank {rank}" if rank is not None else "no rank"
            raise UsageError(f"job.answer: {who} of {self.ticket.name} waits for input now ({self!r})")
        self.mailbox.answer(question, str(text))
        return question.text()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until the job ends (or ``timeout`` seconds); True if it has. Ctrl-C stops the waiting, not the job."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._done.is_set():
                left = WAIT_SLICE_S if deadline is None else min(WAIT_SLICE_S, deadline - time.monotonic())
                if left <= 0:
                    break
                self._done.wait(left)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(f"stopped waiting for {self.ticket.name}; the job goes on (job.cancel() stops it)") from None
        return self._done.is_set()

    def result(self, timeout: Optional[float] = None) -> Any:
        """The RankResults a foreground run would have returned, or the same error (CellError) raised; waits for the end."""
        if not self.wait(timeout):
            raise TimeoutError(f"{self.ticket.name} still runs after {timeout:g} s (job.done() asks without waiting)")
        if self._error is not None:
            raise self._error
        return self._value

    def cancel(self) -> bool:
        """Interrupt the job as Ctrl-C interrupts a foreground cell (a second cancel stops ranks that ignore it);
        a queued job leaves the queue. False when it had already ended."""
        if self._done.is_set():
            return False
        self._cancelled = True
        self.cancel_event.set()
        return True

    outputs: Optional[Callable[[int], List[Tuple[str, str]]]] = None  # the magics' Session.output for this job's cell

    def output(self, rank: int) -> str:
        """Rank ``rank``'s whole output in this job's cell so far, stdout and stderr in the order they came, unprefixed:
        what the cell held back over its budget, or hid with --ranks, included ("" while the job waits in the queue)."""
        if self.outputs is None:
            raise RuntimeError(f"{self.ticket.name}: its output is kept by the notebook's session; this job was made without one")
        if self.state == JobState.QUEUED:
            return ""
        return "".join(text for _, text in self.outputs(rank))

    session: Any = None  # the magics' Session: job.stacks(), and the memory its repr says

    def stacks(self, ranks: Optional[Sequence[int]] = None, all_threads: bool = False, native: bool = False, timeout: Optional[float] = None) -> Any:
        """Every rank's stack now, while the job runs, identical ones once (``%ddp stacks``' view; its ``.replies``, ``.groups``)."""
        if self.session is None:
            raise RuntimeError(f"{self.ticket.name}: its pool is the notebook session's; this job was made without one")
        return self.session.stacks(ranks, all_threads, native, timeout)

    def _memory(self) -> str:
        """', RSS 170.2 MiB to 358.3 MiB, peak 358.3 MiB on rank 2': the ranks' memory as the job's repr says it."""
        if self.session is None:
            return ""
        pairs = [(r.rank, r.mem) for r in self.session.status().ranks]
        said = [t for t in (range_text(m for _, m in pairs), peak_text(pairs)) if t]
        return "".join(f", {t}" for t in said)

    def __await__(self) -> Generator[Any, None, Any]:
        """``await job`` (IPython's autoawait): the result, without holding the kernel's event loop."""
        return self._result_async().__await__()

    async def _result_async(self) -> Any:
        while not self._done.is_set():
            await asyncio.sleep(0.05)
        return self.result()

    def __repr__(self) -> str:
        state = self.state
        if state == JobState.QUEUED:
            return f"<Job {self.ticket.name}: queued>"
        if state == JobState.RUNNING:
            what = "starting" if self.ticket.ran is None else f"running {clock_text(self.elapsed)}{self._memory()}"  # Ticket.text's words
            return f"<Job {self.ticket.name}: {what}{self.ticket.tail()}>"
        if isinstance(self._error, JobCancelled):  # its own words, the cell's and the panel's
            return f"<Job {self.ticket.name}: {self._error.text} ({clock_text(self.elapsed)} on the ranks)>"
        step = self.ticket.progress()
        tail = f", step {step:,}" if step is not None else ""
        why = f": {str(self._error).splitlines()[0]}" if self._error is not None and str(self._error) else ""
        return f"<Job {self.ticket.name}: {state} after {clock_text(self.elapsed)}{tail}{why}>"


def show_error(error: BaseException) -> None:
    """A background cell's error in that cell's output (this runs in its context: the parent header is the cell's)."""
    render = getattr(error, "_render_traceback_", None)
    lines = render() if render is not None else [f"{type(error).__name__}: {error}"]
    try:
        from IPython import get_ipython

        hook = getattr(get_ipython(), "displayhook", None)
        if hook is not None and getattr(hook, "pub_socket", None) is not None:  # ipykernel: an error output, as a failed cell has
            content = {"ename": type(error).__name__, "evalue": str(error), "traceback": lines}
            topic = hook.topic.replace(b"execute_result", b"error") if getattr(hook, "topic", None) else None
            hook.session.send(hook.pub_socket, "error", content, hook.parent_header, ident=topic)
            return
    except Exception:  # a kernel without the pieces above: stderr says it as well
        log.debug("could not send a background cell's error as an error output", exc_info=True)
    print("\n".join(lines), file=sys.stderr)


def asking(jobs: List[Job]) -> Optional[Job]:
    """The first running job one of whose ranks waits for a line (``%ddp_debug`` answers it), or None."""
    return next((j for j in jobs if not j.done() and j.mailbox.question() is not None), None)


def wait_all(jobs: List[Job]) -> None:
    """``%ddp wait``: until every background job has ended, then one line each (Ctrl-C stops the waiting, not the jobs)."""
    running = [j for j in jobs if not j.done()]
    if not running:
        print("no background job is running")
        return
    for job in running:
        job.wait()
    for job in running:
        print(repr(job))


def peek_results(out: PeekOutcome) -> RankResults:
    """A peek's answers in its own cell: what each rank printed (prefixed), then its values, or the CellError of the ranks it failed on."""
    printer = RankPrinter()
    for rank, (stdout, stderr) in sorted(out.output.items()):
        printer.feed(rank, "stdout", stdout)
        printer.feed(rank, "stderr", stderr)
    printer.flush()
    results = RankResults(out.values)
    if out.failures:
        raise CellError(out.failures, out.notes + [PEEK_ONLY], partial=results)
    for note in out.notes:
        print(f"ddp_magic: {note}", file=sys.stderr)
    return results
