"""The status view's presenter (ddp_magic.ui.status_view.StatusView) and its displays.

Part 1 drives a real Pool in this process with the view as its listener, and a
recording comm in place of the kernel's (ipywidgets' own testing approach, see
ipywidgets/widgets/tests/utils.py): every widget message is kept, and the
state transitions each rank showed are read back from the messages. The
throttling, quick-cell and mode tests use the same comm with a fake clock.
Part 2 runs cells in a real kernel and inspects its iopub traffic; part 3
renders a cell in real JupyterLab. The words and tables themselves are tested
without any of this in tests/unit/test_status_render.py.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import types
import uuid
from collections import defaultdict
from typing import Any, Dict, List

import pytest

from format_patterns import CLOCK, SECONDS
from kernel_helper import Kernel

comm = pytest.importorskip("comm")
pytest.importorskip("ipywidgets")

from comm.base_comm import BaseComm  # noqa: E402

from ddp_magic.kernel import RankInfo  # noqa: E402
from ddp_magic.kernel.pool import Pool  # noqa: E402
from ddp_magic.plan import PoolSpec, make_plan  # noqa: E402
from ddp_magic.states import RankState  # noqa: E402
from ddp_magic.words import fmt_seconds  # noqa: E402
from ddp_magic.ui.status_display import WIDGET_MIME  # noqa: E402
from ddp_magic.ui.status_view import StatusView  # noqa: E402
from ddp_magic.ui.ticker import TICKER  # noqa: E402

ROW = re.compile(r"data-rank='(\d+)' data-state='([a-z]+)'")


def text_of(fragment: str) -> str:
    """The words of an HTML fragment's summary line (its header), as a reader sees them."""
    import html as _html

    header = fragment.split("</summary>", 1)[0] if "<summary" in fragment else fragment
    return " ".join(_html.unescape(re.sub(r"<[^>]+>", " ", header)).split())

DONE = rf"%%ddp 2 ranks ✓ {SECONDS} · gloo · ✓ \d+ checks passed"  # any time fmt_seconds writes (tests/format_patterns.py)


# ---------------------------------------------------------------- a recording comm
class RecordingComm(BaseComm):
    """A comm that keeps every message a widget sends instead of publishing it."""

    log: List[Dict[str, Any]] = []

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("comm_id", uuid.uuid4().hex)
        super().__init__(**kwargs)

    def publish_msg(self, msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None, **keys: Any) -> None:
        RecordingComm.log.append({"msg_type": msg_type, "comm_id": self.comm_id, "data": data or {}})


class Comms:
    """What the widgets sent: comm_open and update messages, per widget."""

    def __init__(self, log: List[Dict[str, Any]]) -> None:
        self.log = log

    def updates(self) -> List[Dict[str, Any]]:
        return [m for m in self.log if m["msg_type"] == "comm_msg" and m["data"].get("method") == "update"]

    def opened(self) -> Dict[str, Dict[str, Any]]:
        return {m["comm_id"]: m["data"]["state"] for m in self.log if m["msg_type"] == "comm_open"}

    def values(self, marker: str) -> List[str]:
        """Every value (opening state, then updates) of the HTML widget whose value contains marker."""
        out: List[str] = []
        ids = {cid for cid, st in self.opened().items() if marker in str(st.get("value", ""))}
        for m in self.log:
            if m["comm_id"] not in ids:
                continue
            state = m["data"].get("state", {})
            if "value" in state:
                out.append(state["value"])
        return out

    def transitions(self) -> Dict[int, List[str]]:
        """rank -> the states it showed, in order, repeats collapsed."""
        seq: Dict[int, List[str]] = defaultdict(list)
        for value in self.values("ddp-status-ranks"):
            for rank, state in ROW.findall(value):
                s = seq[int(rank)]
                if not s or s[-1] != state:
                    s.append(state)
        return dict(seq)


class Displays:
    def __init__(self) -> None:
        self.shown: List[Dict[str, Any]] = []
        self.updated: List[Dict[str, Any]] = []

    def display(self, bundle: Dict[str, Any], raw: bool = True, display_id: Any = None) -> Any:
        self.shown.append(bundle)
        return types.SimpleNamespace(display_id="ddp-test-display")

    def update(self, bundle: Dict[str, Any], raw: bool = True, display_id: Any = None) -> None:
        assert display_id == "ddp-test-display"
        self.updated.append(bundle)


@pytest.fixture
def comms(monkeypatch) -> Comms:
    RecordingComm.log = []
    monkeypatch.setattr(comm, "create_comm", lambda **kw: RecordingComm(**kw))
    return Comms(RecordingComm.log)


@pytest.fixture
def displays() -> Displays:
    return Displays()


def make_view(pool: Any, displays: Displays, **kw: Any) -> StatusView:
    kw.setdefault("min_interval", 0.0)  # every event renders: the full history is in the messages
    kw.setdefault("ticker", False)
    kw.setdefault("live_after", 0.0)  # the live widget from the start (quick cells: test_quick_cell_never_builds_widgets)
    return StatusView(pool.nproc, pool=pool, display=displays.display, update_display=displays.update, **kw).show()


@pytest.fixture(scope="module")
def pool():
    p = Pool(2)
    yield p
    p.stop()


def run_cell(pool: Pool, view: StatusView, source: str):
    if pool.started and not pool.broken:
        pool.restart(view)  # so that every test sees the start-up transitions too
    outcome = pool.run(source, listener=view)
    view.finish(outcome)
    return outcome


# ---------------------------------------------------------------- part 1: recording comm, real pool
def test_succeeding_cell_transitions(pool, comms, displays):
    view = make_view(pool, displays)
    outcome = run_cell(pool, view, "import torch.distributed as dist\nprint('hello from rank', dist.get_rank())\ndist.get_rank()")
    assert outcome.ok and outcome.values == [0, 1]
    assert comms.transitions() == {0: ["starting", "connecting", "ready", "running", "done"], 1: ["starting", "connecting", "ready", "running", "done"]}
    final = comms.values("ddp-status-ranks")[-1]
    assert "hello from rank 0" in final and "hello from rank 1" in final
    assert ">cpu<" in final
    for pid in pool.pids:
        assert f">{pid}<" in final
    header = comms.values("ddp-status-header")[-1]
    assert "2 ranks <span" in header and "✓" in header and "gloo" in header and "checks passed" in header
    # the live form is one line and a toggle; the rank table and the env open below it in the browser alone
    opened = comms.opened()
    stacks = [st for st in opened.values() if st.get("_model_name") == "StackModel"]
    assert len(stacks) == 1 and stacks[0]["selected_index"] == 0, "closed while live: one line high"
    assert any(st.get("_model_name") == "LinkModel" for st in opened.values()), "the toggle opens it without the kernel"
    # one display at the top (the widget and its HTML form); when the cell ends the HTML form
    # alone replaces it, and the widgets are closed
    assert len(displays.shown) == 1 and len(displays.updated) == 1
    first, last = displays.shown[0], displays.updated[0]
    root = [cid for cid, st in comms.opened().items() if st.get("_model_name") == "VBoxModel"]
    assert first[WIDGET_MIME]["model_id"] == root[0]
    assert set(first) == {WIDGET_MIME, "text/html"} and set(last) == {"text/html"}
    assert re.match(DONE + rf" · pool started in {SECONDS}$", text_of(last["text/html"]))
    assert "<details class='ddp-status-details'>" in last["text/html"] and "data-state='done'" in last["text/html"]
    assert "<style" not in last["text/html"] and all("<style" not in v for v in comms.values("ddp-status"))
    assert "hello from rank 1" in last["text/html"] and "every rank: MASTER_ADDR=127.0.0.1 " in last["text/html"]
    closed = {m["comm_id"] for m in comms.log if m["msg_type"] == "comm_close"}
    assert set(comms.opened()) <= closed
    assert view.static_text().startswith("ddp_magic status: 2 ranks ✓ ")


def test_failing_rank_transitions(pool, comms, displays):
    view = make_view(pool, displays)
    outcome = run_cell(pool, view, "import torch.distributed as dist\nif dist.get_rank() == 1:\n    raise ValueError('boom')\n'fine'")
    assert not outcome.ok
    t = comms.transitions()
    assert t[0][-2:] == ["running", "done"]
    assert t[1][-2:] == ["running", "failed"]
    header = comms.values("ddp-status-header")[-1]
    assert "✗" in header and "rank 1 raised ValueError: boom" in header
    assert view.summary().startswith("2 ranks ✗ rank 1 raised ValueError: boom · ")
    assert "data-state='failed'" in displays.updated[-1]["text/html"]
    assert "rank 1 raised ValueError: boom" in text_of(displays.updated[-1]["text/html"])


def test_the_root_cause_alone_is_failed(pool, comms, displays):
    """Rank 1 raises while rank 0 waits in a collective: rank 1 failed; rank 0, stopped by ddp_magic, is 'stopped'."""
    view = make_view(pool, displays)
    source = "import torch, torch.distributed as dist\nif dist.get_rank() == 1:\n    raise ValueError('boom')\ndist.all_reduce(torch.ones(1))"
    outcome = run_cell(pool, view, source)
    assert not outcome.ok and outcome.failures[0].rank == 1
    final = displays.updated[-1]["text/html"]
    assert ROW.findall(final.split("ddp-status-ranks", 1)[1]) == [("0", "stopped"), ("1", "failed")]
    assert "data-rank='0' data-state='stopped'" in final.split("</summary>", 1)[0], "the rank's square says so too"
    assert "data-outcome='failed'" in final and "killed" not in text_of(final)


def test_dying_rank_transitions(pool, comms, displays):
    view = make_view(pool, displays)
    outcome = run_cell(pool, view, "import os, signal, torch.distributed as dist\nif dist.get_rank() == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n'alive'")
    assert not outcome.ok
    t = comms.transitions()
    assert t[1][-2:] == ["running", "killed"]
    assert t[0][-1] == "done"
    final = comms.values("ddp-status-ranks")[-1]
    assert "SIGKILL" in final and "was killed by SIGKILL" in final  # the cell and its tooltip
    assert "2 ranks ✗ rank 1 (pid" in view.summary() and "SIGKILL" in view.summary()
    # an exit code, not a signal: the next cell restarts the broken pool, the view hears it
    view2 = make_view(pool, displays)
    outcome2 = pool.run("import os, torch.distributed as dist\nif dist.get_rank() == 0:\n    os._exit(3)\n", listener=view2)
    view2.finish(outcome2)
    assert [s for r, s in view2.history if r == 0][-2:] == ["running", "died"]
    assert any("restarted the pool" in n or "started it again" in n for n in view2.notices)
    assert "exit 3" in view2.ranks_html() and "exited with code 3" in view2.ranks_html()


def test_env_section_shows_variables_and_checks(pool, comms, displays):
    view = make_view(pool, displays)
    env = comms.values("ddp-status-env")[0]
    plan = pool.plan
    common = re.search(r"every rank: ([^<]*)</div>", env).group(1).split()
    assert common == [f"{k}={plan.rank_env(0)[k]}" for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK")]
    assert re.findall(r"<th[^>]*>([A-Z_]+)</th>", env) == ["RANK", "LOCAL_RANK"], "per rank: only what differs"
    assert re.search(r"✓ \d+ checks passed", env.split("<details>")[0]) and "<li" not in env.split("<details>")[0], "healthy: one line"
    assert "data-check='ranks unique and complete' data-ok='true'" in env
    assert "data-check='backend available' data-ok='true'" in env
    view.finish(None, RuntimeError("never ran"))
    assert view.summary().startswith("2 ranks ✗ RuntimeError: never ran · ")


# ---------------------------------------------------------------- throttling
class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def fake_infos(n: int, state: RankState = RankState.RUNNING, started: float = 1000.0) -> List[RankInfo]:
    return [RankInfo(rank=r, state=state, pid=4000 + r, device="cpu", started=started) for r in range(n)]


def test_chatty_output_is_coalesced(comms, displays):
    clock = FakeClock()
    view = StatusView(4, plan=make_plan(PoolSpec(4)), mode="widget", live_after=0.0, min_interval=0.2, ticker=False, clock=clock,
                      display=displays.display, update_display=displays.update).show()
    infos = fake_infos(4)
    for info in infos:
        view.on_state(info)
    before = len(comms.updates())
    for i in range(10_000):  # 10,000 lines on 4 ranks over 2 simulated seconds
        for info in infos:
            info.last_line = f"line {i}"
            view.on_output(info.rank, "stdout", f"line {i}\n")
        clock.t += 0.0002
    for info in infos:
        info.state, info.finished = RankState.DONE, clock.t
        view.on_state(info)
    view.finish(types.SimpleNamespace(ok=True, elapsed=2.0, failures=[]))
    sent = len(comms.updates()) - before
    assert view.renders <= 2.0 / 0.2 + 3
    assert sent <= 3 * view.renders
    assert comms.transitions()[3][-1] == "done"  # the final state always goes out
    assert "line 9999" in comms.values("ddp-status-ranks")[-1]


def test_ticker_sends_what_was_held_back_and_moves_the_clock(comms, displays):
    view = StatusView(2, plan=make_plan(PoolSpec(2)), mode="widget", live_after=0.0, min_interval=0.2, refresh=0.3,
                      display=displays.display, update_display=displays.update).show()
    infos = fake_infos(2, started=time.monotonic())
    view.on_state(infos[0])  # within min_interval of show(): held back
    view.on_state(infos[1])
    assert view.renders == 0 and view._dirty
    time.sleep(0.7)
    assert not view._dirty, "the ticker rendered the held-back change"
    assert comms.transitions() == {0: ["starting", "running"], 1: ["starting", "running"]}
    n, c = view.renders, view.clock_renders
    try:
        time.sleep(1.0)  # no event at all: the clock still moves (the header alone)
        assert view.clock_renders > c and view.renders == n
        assert view.clock_renders <= c + 1.0 / view.clock_tick + 1, "never more often than the clock's tick"
    finally:
        view.finish(types.SimpleNamespace(ok=True, elapsed=1.7, failures=[]))
    assert not TICKER.has(view)
    n, c = view.renders, view.clock_renders
    time.sleep(0.3)
    assert (view.renders, view.clock_renders) == (n, c), "nothing renders after the cell ended"


def test_the_ticker_sleeps_between_renders(comms, displays):
    """A silent running cell: the ticker wakes once a clock tick and sends the header line alone (its clock moves);
    nothing else is rendered. Printed lines alone are rendered once a refresh, not once a min_interval."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("counts wake-ups in Linux /proc")
    view = StatusView(2, plan=make_plan(PoolSpec(2)), mode="widget", live_after=0.0, min_interval=0.05, refresh=0.5, clock_tick=0.25,
                      display=displays.display, update_display=displays.update).show()
    for info in fake_infos(2, started=time.monotonic()):
        view.on_state(info)
    time.sleep(0.2)
    tid = TICKER.thread.native_id
    switches = lambda: int(open(f"/proc/self/task/{tid}/status").read().split("\nvoluntary_ctxt_switches:")[1].split()[0])  # noqa: E731
    before, renders, ticks = switches(), view.renders, view.clock_renders
    time.sleep(2.0)
    assert switches() - before <= 2.0 / 0.25 + 3, "one wake-up per clock tick (0.25 s), not one per min_interval (0.05 s)"
    assert view.renders == renders, "nothing but the clock moved: no whole render"
    assert 3 <= view.clock_renders - ticks <= 2.0 / 0.25 + 1, "the clock moved, at most once a tick (a loaded machine may skip one)"
    renders = view.renders
    t_end = time.monotonic() + 1.0
    while time.monotonic() < t_end:  # a chatty rank: 100 lines a second
        view.on_output(0, "stdout", "x\n")
        time.sleep(0.01)
    assert view.renders - renders <= 4, "printed lines are rendered once a refresh"
    view.finish(types.SimpleNamespace(ok=True, elapsed=3.2, failures=[]))
    assert not TICKER.has(view) and TICKER.thread.is_alive(), "the kernel's one ticker outlives its cells"


def _header_updates(comms: Comms) -> List[str]:
    return [text_of(v) for v in comms.values("ddp-status-header")]


def test_the_live_clock_moves_at_the_precision_it_shows(comms, displays):
    """Tenths on the clock, a move every tenth of a second: each tick sends the header alone, with the clock's true value."""
    clock = FakeClock()
    view = StatusView(2, plan=make_plan(PoolSpec(2)), mode="widget", live_after=0.0, min_interval=0.2, ticker=False, clock=clock,
                      display=displays.display, update_display=displays.update).show()
    for info in fake_infos(2, started=clock.t):
        view.on_state(info)
    seen = []
    for i in range(25):  # 2.5 simulated seconds, the ticker's calls in its place
        clock.t += 0.1
        view.tick()
        seen.append(re.search(rf"running 2 · ({CLOCK})", _header_updates(comms)[-1]).group(1))
        if i == 2:  # the held-back change of state went out (min_interval): from now on, the clock alone moves
            bodies = len(comms.values("ddp-status-body"))
    assert seen == [f"{0.1 * i:.1f} s" for i in range(1, 26)], "every tick: the run clock, to the tenth"
    assert len(comms.values("ddp-status-body")) == bodies, "the body is not re-sent for the clock"
    assert view.clock_renders >= 20 and view.renders <= 2
    view.finish(types.SimpleNamespace(ok=True, elapsed=2.5, failures=[]))


def test_the_body_opens_itself_once_for_a_bar(comms, displays):
    """A tqdm bar (or a chart) is worth watching: the live body opens without a click, once (a user may close it)."""
    clock = FakeClock()
    view = StatusView(2, plan=make_plan(PoolSpec(2)), mode="widget", live_after=0.0, min_interval=0.0, ticker=False, clock=clock,
                      display=displays.display, update_display=displays.update).show()
    for info in fake_infos(2, started=clock.t):
        view.on_state(info)

    def opened() -> List[Any]:
        return [m["data"]["state"].get(k) for m in comms.updates() for k in ("selected_index", "index") if k in m["data"]["state"]]

    assert opened() == [], "nothing to watch yet: one line"
    clock.t += 1.0
    view.on_output(1, "stderr", "\r 10%|#    | 1/10 [00:00<00:09, 1.00it/s]")
    assert opened() == [1, 1], "the stack and the toggle: the rank table with the bars shows"
    for i in range(2, 10):
        clock.t += 1.0
        view.on_output(1, "stderr", f"\r {i * 10}%|#    | {i}/10 [00:0{i}<00:01, 1.00it/s]")
    assert opened() == [1, 1], "opened once: a user who closes it keeps it closed"
    assert "90% 1.00 it/s" in _header_updates(comms)[-1]
    view.finish(types.SimpleNamespace(ok=True, elapsed=9.0, failures=[]))


# ---------------------------------------------------------------- quick cells, and going live
def test_quick_cell_never_builds_widgets(pool, comms, displays):
    """A cell over before live_after: one display, at its end; no comm traffic. One that prints: its line goes up
    before the first output (so the view stays above it), replaced once at the end."""
    if not pool.started:
        pool.start()
    silent = StatusView(pool.nproc, pool=pool, live_after=5.0, ticker=False, display=displays.display, update_display=displays.update).show()
    assert displays.shown == []
    silent.finish(pool.run("1", listener=silent))
    assert len(displays.shown) == 1 and displays.updated == [] and comms.log == []
    assert re.match(DONE, text_of(displays.shown[0]["text/html"]))
    displays.shown.clear()
    view = StatusView(pool.nproc, pool=pool, live_after=5.0, ticker=False, display=displays.display, update_display=displays.update).show()
    outcome = pool.run("import torch.distributed as dist\nprint('quick', dist.get_rank())\ndist.get_rank()", listener=view)
    view.finish(outcome)
    assert outcome.ok and outcome.values == [0, 1]
    assert comms.log == [], "no widget model was opened"
    assert len(displays.shown) == 1 and len(displays.updated) == 1
    first, last = displays.shown[0], displays.updated[0]
    assert set(first) == {"text/html"} and set(last) == {"text/html"}
    assert text_of(first["text/html"]).startswith("%%ddp 2 ranks")
    assert re.match(DONE, text_of(last["text/html"]))
    assert "quick 1" in last["text/html"] and "data-state='done'" in last["text/html"]


def test_a_long_cell_goes_live_then_settles(comms, displays):
    clock = FakeClock()
    view = StatusView(2, plan=make_plan(PoolSpec(2)), mode="widget", live_after=0.3, min_interval=0.0, ticker=False, clock=clock,
                      display=displays.display, update_display=displays.update).show()
    infos = fake_infos(2, started=clock.t)
    view.on_state(infos[0])  # before live_after: held back, nothing sent
    assert comms.log == [] and displays.updated == [] and view._dirty
    clock.t += 0.31
    view.on_state(infos[1])  # the first change after live_after puts up the live widget
    assert len(displays.shown) == 1 and WIDGET_MIME in displays.shown[0] and displays.updated == []
    root = [cid for cid, st in comms.opened().items() if st.get("_model_name") == "VBoxModel"]
    assert displays.shown[0][WIDGET_MIME]["model_id"] == root[0]
    assert comms.transitions() == {0: ["running"], 1: ["running"]}, "the widget opens with the held-back state"
    for info in infos:
        info.state, info.finished = RankState.DONE, clock.t
        view.on_state(info)
    view.finish(types.SimpleNamespace(ok=True, elapsed=0.5, failures=[]))
    assert comms.transitions() == {0: ["running", "done"], 1: ["running", "done"]}
    assert set(displays.updated[-1]) == {"text/html"} and "data-state='done'" in displays.updated[-1]["text/html"]
    closed = {m["comm_id"] for m in comms.log if m["msg_type"] == "comm_close"}
    assert set(comms.opened()) <= closed


def test_the_ticker_makes_a_silent_cell_live(comms, displays):
    view = StatusView(2, plan=make_plan(PoolSpec(2)), mode="widget", live_after=0.2, min_interval=0.05,
                      display=displays.display, update_display=displays.update).show()
    time.sleep(0.6)  # no event at all: the ticker alone puts the widget up
    assert any(WIDGET_MIME in b for b in displays.shown)
    view.finish(types.SimpleNamespace(ok=True, elapsed=0.6, failures=[]))
    assert set(displays.updated[-1]) == {"text/html"}


# ---------------------------------------------------------------- other modes, a broken view
def test_html_mode_without_ipywidgets(displays, comms):
    clock = FakeClock()
    view = StatusView(2, plan=make_plan(PoolSpec(2)), mode="html", ticker=False, clock=clock, min_interval=0.2,
                      display=displays.display, update_display=displays.update).show()
    for info in fake_infos(2):
        view.on_state(info)
    clock.t += 1
    view.on_output(0, "stdout", "x\n")
    assert WIDGET_MIME not in displays.shown[0] and "text/html" in displays.shown[0]
    view.finish(types.SimpleNamespace(ok=True, elapsed=1.0, failures=[]))
    assert comms.log == []  # no widget at all
    assert text_of(displays.updated[-1]["text/html"]).startswith("%%ddp 2 ranks ✓ 1.00 s · gloo")
    assert len(displays.updated) <= 3


def test_text_mode_prints_the_summary_once_at_the_end(displays, comms):
    view = StatusView(2, plan=make_plan(PoolSpec(2)), mode="text", ticker=False, display=displays.display, update_display=displays.update).show()
    for info in fake_infos(2):
        view.on_state(info)
    assert displays.shown == []
    view.finish(types.SimpleNamespace(ok=True, elapsed=1.5, failures=[]))
    assert len(displays.shown) == 1 and re.fullmatch(r"ddp_magic status: 2 ranks ✓ 1\.50 s · gloo · ✓ \d+ checks passed", displays.shown[0]["text/plain"])
    assert comms.log == []


def test_a_broken_view_never_breaks_the_cell(displays, comms, capsys):
    view = StatusView(
        2, plan=make_plan(PoolSpec(2)), mode="widget", live_after=0.0, ticker=False, display=displays.display, update_display=displays.update
    ).show()
    view.display.widgets["body"] = None  # rendering now raises
    view.on_state(fake_infos(1)[0])
    view.on_output(0, "stdout", "x")
    view.finish(None)
    assert "status view stopped updating" in capsys.readouterr().err


# ---------------------------------------------------------------- part 2: a real kernel
def _iopub(ex) -> Dict[str, List[dict]]:
    kinds: Dict[str, List[dict]] = defaultdict(list)
    for i, m in enumerate(ex.messages):
        m = dict(m, index=i)
        kinds[m["msg_type"]].append(m)
    return kinds


def _raw(ex, name: str) -> str:
    """A stream's text exactly as the kernel sent it (ANSI colours included)."""
    return "".join(m["content"]["text"] for m in ex.messages if m["msg_type"] == "stream" and m["content"]["name"] == name)


def _widget_updates(ex) -> List[dict]:
    return [dict(m, index=i) for i, m in enumerate(ex.messages) if m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "update"]


@pytest.mark.kernel
def test_kernel_iopub_carries_the_widget(kernel):
    ex = kernel.run("%%ddp -n 2\nimport time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(0.25)\n", timeout=180).ok()
    kinds = _iopub(ex)
    opened = {m["content"]["comm_id"]: m["content"]["data"]["state"] for m in kinds["comm_open"] if m["content"]["target_name"] == "jupyter.widget"}
    assert any(st.get("_model_name") == "VBoxModel" and "ddp-status" in st.get("_dom_classes", []) for st in opened.values())
    # one display, at the top: the summary line (a rank printed first) or the widget (the cell ran past live_after first)
    shown = kinds["display_data"]
    assert len(shown) == 1
    assert set(shown[0]["content"]["data"]) <= {"text/html", WIDGET_MIME}  # no text/plain: the cell's result stays its own
    assert text_of(shown[0]["content"]["data"]["text/html"]).startswith("%%ddp 2 ranks ·")
    first_stream = min(m["index"] for m in kinds["stream"])
    assert shown[0]["index"] < first_stream, "the view is at the top, above the ranks' output"
    live = [m for m in kinds["display_data"] + kinds["update_display_data"] if WIDGET_MIME in m["content"]["data"]]
    assert len(live) == 1 and live[0]["content"]["transient"]["display_id"] == shown[0]["content"]["transient"]["display_id"]
    model = live[0]["content"]["data"][WIDGET_MIME]["model_id"]
    assert model in opened
    assert set(live[0]["content"]["data"]) == {WIDGET_MIME, "text/html"}
    assert live[0]["index"] < max(s["index"] for s in kinds["stream"]), "live while the ranks still printed"
    assert ex.result is None
    updates = _widget_updates(ex)
    assert len(updates) >= 4, "live updates while the cell ran"
    assert any(m["index"] < max(s["index"] for s in kinds["stream"]) for m in updates), "updates came while output was still arriving"
    clocks = [re.search(rf"running 2 · ({CLOCK}) ·", text_of(v)) for v in
              (m["content"]["data"]["state"].get("value", "") for m in updates) if "ddp-status-header" in v and "running 2" in v]
    seen = [float(c.group(1).split()[0]) for c in clocks if c and c.group(1).endswith(" s") and " m " not in c.group(1)]
    assert len(set(seen)) >= 4 and seen == sorted(seen), f"the live clock moves in tenths while the ranks run: {seen}"
    ranks_values = [m["content"]["data"]["state"]["value"] for m in updates if "ddp-status-ranks" in m["content"]["data"]["state"].get("value", "")]
    assert ROW.findall(ranks_values[-1]) == [("0", "done"), ("1", "done")]
    assert "tick 3" in ranks_values[-1]
    final = kinds["update_display_data"][-1]["content"]
    assert final["transient"]["display_id"] == shown[0]["content"]["transient"]["display_id"]
    assert set(final["data"]) == {"text/html"}
    assert re.match(DONE + rf"( · pool started in {SECONDS})?$", text_of(final["data"]["text/html"]))
    assert {m["content"]["comm_id"] for m in kinds["comm_close"]} == set(opened), "the widgets are closed when the cell ends"
    assert "[\x1b[35mrank 1\x1b[0m] tick 3" in _raw(ex, "stdout")  # the streams still carry the output, the prefix in the rank's colour


@pytest.mark.kernel
def test_kernel_a_pool_restart_is_a_notice_with_the_cell_s_time_format(kernel):
    """-n 2 → 3: the notice is on stdout (not an error), above the ranks' lines; its time reads like the view's."""
    for _run in range(2):
        kernel.run("%%ddp -n 2\n1", timeout=180).ok()
        ex = kernel.run("%%ddp -n 3\nprint('hi')", timeout=180).ok()
        assert "restarting" not in ex.stderr
        notice = [ln for ln in ex.stdout.splitlines() if ln.startswith("ddp_magic: restarting the pool (-n 2 → 3)")]
        said = re.search(rf": old ranks stopped in {SECONDS}, pool started in ({SECONDS}), ", notice[0]) if len(notice) == 1 else None
        assert said, ex.stdout
        assert ex.stdout.index(notice[0]) < ex.stdout.index("] hi"), "the notice comes first, in the cell's own stream"
        final = (_iopub(ex)["display_data"] + _iopub(ex)["update_display_data"])[-1]["content"]["data"]["text/html"]
        shown = re.search(rf"· pool started in ({SECONDS})$", text_of(final))
        assert shown, text_of(final)
        # one start, one figure: the notice and the view say the pool's own measure (Pool.start_seconds)
        took = kernel.value("get_ipython().magics_manager.registry['DDPMagics'].session.pool.start_seconds")
        assert shown.group(1) == said.group(1) == fmt_seconds(took), (notice[0], text_of(final), took)
    restart = kernel.run("%ddp restart -n 2", timeout=180).ok()  # what the panel's Restart toast shows too (ui/labcomm.py)
    assert re.search(rf"^pool of 2 \(gloo\) ready in {SECONDS}, pids \[\d+, \d+\]$", restart.stdout, re.M), restart.stdout


@pytest.mark.kernel
def test_kernel_failing_rank_and_no_widget_option(kernel):
    ex = kernel.run("%%ddp -n 2\nimport torch.distributed as dist\nif dist.get_rank() == 1:\n    raise KeyError('lost')\n", timeout=180)
    assert ex.error is not None
    kinds = _iopub(ex)
    final = text_of((kinds["display_data"] + kinds["update_display_data"])[-1]["content"]["data"]["text/html"])
    assert final.startswith("%%ddp 2 ranks ✗ rank 1 raised KeyError")
    kernel.run("%%ddp\n1", timeout=180).ok()  # the pool restarts after the failure
    quick = kernel.run("%%ddp\n1", timeout=120).ok()  # a warm pool: over before the view would go live
    kinds = _iopub(quick)
    assert not kinds["comm_open"] and not kinds["comm_msg"], "a quick cell opens no widget"
    assert [set(m["content"]["data"]) for m in kinds["display_data"] + kinds["update_display_data"]] == [{"text/html"}], "one display message"
    assert re.match(DONE, text_of(kinds["display_data"][0]["content"]["data"]["text/html"]))
    quiet = kernel.run("%%ddp --no-widget\nprint('plain')", timeout=120).ok()
    kinds = _iopub(quiet)
    assert not kinds["comm_open"] and not kinds["comm_msg"] and not kinds["display_data"]
    assert "[\x1b[34mrank 0\x1b[0m] plain" in _raw(quiet, "stdout")


@pytest.mark.kernel
def test_kernel_ddp_env_live_and_planned():
    k = Kernel(extra_env={"DDP_MAGIC_WARM_TEMPLATE": "0"})  # no warm-up at %load_ext: a pool imports torch in the kernel, the checks must not
    try:
        k.run("%load_ext ddp_magic").ok()
        data = k.value("%ddp_env -n 4 --backend nccl --json")
        assert data["state"] == "planned" and data["ok"] is False
        failed = {c["name"] for c in data["checks"] if not c["ok"]}
        assert {"GPUs for the backend", "backend available"} <= failed
        assert [r["RANK"] for r in data["ranks"]] == ["0", "1", "2", "3"]
        assert k.value("'torch' in __import__('sys').modules") is False, "the checks must not import torch in the kernel"
        cell = k.run("%%ddp -n 2\n1", timeout=180).ok()
        live = k.run("%ddp_env").ok()
        m = re.match(r"live env of 2 ranks, backend gloo — ✓ (\d+) checks passed; from the ranks: ✓ \d+ checks passed\n", live.result)
        assert m, live.result
        shown = text_of((_iopub(cell)["display_data"] + _iopub(cell)["update_display_data"])[-1]["content"]["data"]["text/html"])
        assert re.search(rf"✓ {m.group(1)} checks passed", shown), f"the cell and %ddp_env count the same checks: {shown}"
        assert live.result.count("MASTER_ADDR=") == 1 and "\nRANK  LOCAL_RANK\n0     0\n1     1\n" in live.result, "shared once"
        assert "process group" not in live.result, "a healthy env: the verdict, not every check"
        page = live.displays[-1]["text/html"]
        assert "<table" in page and "<style" not in page
        assert "process group" in page.split("<details", 1)[1], "every check one click away"
    finally:
        k.shutdown()


@pytest.mark.kernel
def test_kernel_chatty_cell_on_four_ranks_is_throttled(kernel):
    ex = kernel.run("%%ddp -n 4\nfor i in range(10000):\n    print('line', i)\n", timeout=300).ok()
    updates = _widget_updates(ex)
    lines = ex.stdout.count("\n")
    print(f"\n10,000 lines x 4 ranks: {lines} lines in the streams, {len(updates)} widget updates, cell {ex.elapsed:.1f} s")
    assert lines >= 40_000
    assert len(updates) <= 300
    final = _iopub(ex)["update_display_data"][-1]["content"]["data"]["text/html"]
    assert text_of(final).startswith("%%ddp 4 ranks ✓")
    assert "line 9999" in final


def _ranks_of(line: str) -> List[int]:
    """The ranks a '[rank 2] …' or '[ranks 0-1, 3] …' line speaks for."""
    label = line[1:].split("]", 1)[0].split(" ", 1)[1]
    out: List[int] = []
    for part in label.replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


@pytest.mark.kernel
def test_kernel_tqdm_on_four_ranks_leaves_one_line_per_rank(kernel):
    """Each rank's bar redraws in place: the status view shows it live, the streams keep its final state only."""
    pytest.importorskip("tqdm")
    code = "%%ddp -n 4\nimport time\nfrom tqdm import tqdm\nfor i in tqdm(range(20), mininterval=0.05, desc='train'):\n    time.sleep(0.05)\nprint('after')"
    for _run in range(2):  # the second run too
        ex = kernel.run(code, timeout=300).ok()
        assert _raw(ex, "stderr") == "", "a bar's final state is progress, not an error: no stderr block"
        raw = _raw(ex, "stdout")
        assert "\r" not in raw, "no redraw fragments in the saved output"
        lines = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", raw).splitlines() if ln.startswith("[rank")]  # not a notice
        for r in range(4):  # one order per rank: its bar's final state, then what it printed next
            mine = [ln.split("] ", 1)[1] for ln in lines if _ranks_of(ln) == [r]]
            assert len(mine) == 2 and "20/20" in mine[0] and mine[0].startswith("train: 100%") and mine[1] == "after", mine
        bars = [m["content"]["data"]["state"]["value"] for m in _widget_updates(ex) if "ddp-status-bar" in m["content"]["data"]["state"].get("value", "")]
        assert bars, "the live view showed the ranks' bars"
        assert re.search(r"data-total='20'", bars[-1])
        said = [text_of(v) for v in bars if "ddp-status-header" in v]
        assert any(re.search(r" · \d+% [\d.]+ it/s · gloo", t) for t in said), "the mini bars say their percentage and rate"
        opened = [m["content"]["data"]["state"] for m in _widget_updates(ex) if "selected_index" in m["content"]["data"]["state"]]
        assert [st["selected_index"] for st in opened] == [1], "the body opened itself once, for the bars"


# ---------------------------------------------------------------- part 3: real JupyterLab in headless Chromium
@pytest.mark.slow
@pytest.mark.kernel
def test_widget_renders_in_jupyterlab(tmp_path):
    """scripts/screenshot_widget.py: a 4-rank cell in JupyterLab; the browser shows the settled summary and 4 done rows."""
    import importlib.util
    import json
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "scripts", "screenshot_widget.py")
    spec = importlib.util.spec_from_file_location("screenshot_widget", script)
    shot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shot)  # type: ignore[union-attr]
    if importlib.util.find_spec("playwright") is None or shot.find_chromium() is None:
        pytest.skip("needs Python Playwright and a system Chromium (apt-get install -y chromium)")
    out = tmp_path / "widget.png"
    live = tmp_path / "widget-live.png"  # never the committed docs/img copies: a test run leaves the tree clean
    proc = subprocess.run([sys.executable, script, "--out", str(out), "--live-out", str(live), "-n", "4"], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["rows"] == 4 and info["done"] == 4
    assert re.match(rf"%%ddp 4 ranks ✓ {SECONDS} · gloo · ✓ \d+ checks passed", info["header"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
