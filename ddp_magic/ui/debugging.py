"""Debugging ranks from the notebook: the kernel's own stdin answers them, and %ddp_debug's post-mortem.

A rank's ``input()``, ``getpass`` and pdb prompts reach the pool as questions
(kernel/jobs/stdin.py); here they become the kernel's own ``input``/``getpass``,
which ipykernel turns into an ``input_request`` on the stdin channel: an input
box in a notebook, a prompt in a console. A front end without stdin makes
ipykernel raise StdinNotImplementedError, which the rank reads as EOF, with
the reason. A background cell's questions wait in its job's mailbox instead
(``background_mailbox``); ``%ddp_debug`` answers them from the cell it runs in (``attach``).
"""
from __future__ import annotations

import contextvars
import sys
from typing import Any, Callable, Dict, Optional, Sequence

from IPython.core.error import StdinNotImplementedError

from ..errors import RankFailure, UsageError
from ..kernel import Listener
from ..kernel.pool import Pool
from ..kernel.jobs.stdin import NO_STDIN, Ask, Mailbox
from ..states import FailureKind
from ..wire import protocol as P

NO_FAILURE = "%ddp_debug: no %%ddp cell has failed with an error yet; there is nothing to debug (give a rank to try anyway: %ddp_debug 1)"
NO_POOL = "%ddp_debug: no pool is running; the frames of a failed cell live on its ranks"
ATTACH_SETTLE_S = 0.5  # %ddp_debug on a background job: how long it waits for a rank's next question once the rank left pdb


def kernel_ask(before: Callable[[], None] = lambda: None) -> Ask:
    """The kernel's own input: what a rank's question becomes in the notebook. ``before`` shows pending output first."""

    def ask(prompt: str, password: bool) -> str:
        before()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        try:
            if password:
                import getpass

                return getpass.getpass(prompt)
            return input(prompt)
        except StdinNotImplementedError:
            raise EOFError(NO_STDIN) from None

    return ask


class Reroute:
    """Where a background job's output goes while a cell answers its ranks (kernel/stdin.Mailbox's ``reroute``).

    ipykernel keeps a stream's parent header in a context variable (``OutStream._parent_header``);
    the job's thread sets it, in its own context only, to the answering cell's header, and back
    to its own cell's when that cell is done. Elsewhere (no ipykernel) the output stays put."""

    def __init__(self) -> None:
        self.home = here()  # the background cell's headers (made in that cell)

    def __call__(self, where: Any) -> None:
        for name, header in (where if where is not None else self.home).items():
            var = getattr(getattr(sys, name, None), "_parent_header", None)
            if isinstance(var, contextvars.ContextVar):
                var.set(header)


def here() -> Dict[str, Any]:
    """The current cell's parent headers of stdout and stderr (ipykernel), to send output to this cell from another thread."""
    out: Dict[str, Any] = {}
    for name in ("stdout", "stderr"):
        var = getattr(getattr(sys, name, None), "_parent_header", None)
        if isinstance(var, contextvars.ContextVar):
            out[name] = var.get({})
    return out


def background_mailbox(flush: Callable[[], None], notice: Callable[[str], None]) -> Mailbox:
    """A background cell's stdin: its ranks' questions wait, said in its cell, for ``%ddp_debug`` or ``job.answer``."""
    return Mailbox(before=flush, tell=lambda q: notice(f"{q.text()}: answer it with %ddp_debug (or job.answer('...'))"), reroute=Reroute())


def attach(job: Any, line: str, ask: Ask) -> None:
    """``%ddp_debug`` while a background job's rank waits for a line: this cell answers it (an input box here), and
    the next ones while that rank sits in pdb; the job's output shows here meanwhile. Ends when the rank goes on."""
    box: Mailbox = job.mailbox
    text = line.strip()
    if text and not text.isdigit():
        raise UsageError(f"%ddp_debug: {text!r} is not a rank; e.g. %ddp_debug 1")
    question = box.question(int(text) if text else None)
    if question is None:
        raise UsageError(f"%ddp_debug: rank {text} of {job.ticket.name} does not wait for input ({job!r})")
    print(f"ddp_magic: {job.ticket.name}: {question.text()}; answering here (its output shows here meanwhile)")
    box.attach(here())
    try:
        while question is not None:
            try:
                line_in, eof = ask(f"[{question.name}] {question.prompt}", question.password), None
            except EOFError as e:
                line_in, eof = "", str(e) or NO_STDIN
            box.answer(question, line_in, eof)
            question = box.next_question(question, ATTACH_SETTLE_S)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"stopped answering {job.ticket.name}; its rank still waits (%ddp_debug again, job.answer(...) or job.cancel())") from None
    finally:
        box.detach()


def debug_rank(failures: Sequence[RankFailure], rank: Optional[int]) -> Optional[int]:
    """The rank to debug: the one asked for, else the root-cause rank whose cell raised (None: none did)."""
    if rank is not None:
        return rank
    errors = [f.rank for f in failures if f.kind == FailureKind.ERROR]
    return errors[0] if errors else None


def parse_rank(line: str, nproc: int) -> Optional[int]:
    text = line.strip()
    if not text:
        return None
    if not text.isdigit() or int(text) >= nproc:
        raise UsageError(f"%ddp_debug: {text!r} is not a rank of this pool (0-{nproc - 1}); e.g. %ddp_debug 1")
    return int(text)


def post_mortem(pool: Optional[Pool], failures: Sequence[RankFailure], line: str, listener: Listener, ask: Ask, quiet: bool = False) -> None:
    """pdb on a rank's kept traceback (``line``: the rank, or empty for the root cause), driven through ``ask``.

    ``quiet``: nothing to debug is no error (the automatic post-mortem of ``--pdb`` and ``%pdb on``)."""
    if pool is None or not pool.alive:
        if quiet:
            return
        raise UsageError(NO_POOL)
    rank = debug_rank(failures, parse_rank(line, pool.nproc))
    if rank is None:
        if quiet:
            return
        raise UsageError(NO_FAILURE)
    pool.run(P.POST_MORTEM_SOURCE.format(rank=rank), listener=listener, label="debug", stdin=ask)


def once_instead_of_ipython(shell: Any) -> None:
    """With ``%pdb on`` IPython would open its own debugger on the magic's frames after ours: not this once."""
    if shell is None or not getattr(shell, "call_pdb", False):
        return
    shell.call_pdb = False

    def restore(result: Any) -> None:
        shell.call_pdb = True
        shell.events.unregister("post_run_cell", restore)

    shell.events.register("post_run_cell", restore)
