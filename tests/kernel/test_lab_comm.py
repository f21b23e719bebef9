"""The kernel side of the JupyterLab extension (ddp_magic/ui/labcomm.py), driven like the front end drives it.

A real kernel, a real pool of 2 ranks. The test plays the part of labextension/src/connection.ts:
comm_info_request for the target, comm_open, requests on the comm, snapshots read from iopub.
"""
from __future__ import annotations

import functools
import os
import queue
import re
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List, Optional, Set

import pytest

from kernel_helper import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = "ddp_magic"


class Front:
    """A minimal front end on one kernel: the comm, and every comm message that arrived for it."""

    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        self.kc = kernel.kc
        self.comm_id: Optional[str] = None
        self.msgs: List[dict] = []  # (data of) comm_msg for our comm, in order
        self.times: List[float] = []
        self.sent: List[float] = []  # when the kernel sent each (its header's date): the throttle's clock, not this process's
        self.closed = False
        self.other: List[dict] = []  # every other iopub message seen while pumping

    def clear(self) -> None:
        self.msgs.clear()
        self.times.clear()
        self.sent.clear()

    def comm_info(self) -> Dict[str, Any]:
        mid = self.kc.comm_info(target_name=TARGET)
        deadline = time.monotonic() + 30
        while True:  # skip the replies of earlier requests (execute_reply) on the shell channel
            reply = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == mid:
                assert reply["msg_type"] == "comm_info_reply"
                return reply["content"]["comms"]

    subshell: Optional[str] = None  # send comm messages over this kernel subshell (as JupyterLab >= 4.4 does)

    def _send(self, msg_type: str, content: dict) -> dict:
        msg = self.kc.session.msg(msg_type, content)
        if self.subshell:
            msg["header"]["subshell_id"] = self.subshell
        self.kc.shell_channel.send(msg)
        return msg

    def create_subshell(self) -> str:
        msg = self.kc.session.msg("create_subshell_request", {})
        self.kc.control_channel.send(msg)
        reply = self.kc.get_control_msg(timeout=10)
        assert reply["content"]["status"] == "ok", reply["content"]
        return reply["content"]["subshell_id"]

    def open(self) -> None:
        self.comm_id = uuid.uuid4().hex
        self._send("comm_open", {"comm_id": self.comm_id, "target_name": TARGET, "data": {"type": "hello", "protocol": 1, "version": "test"}})

    def request(self, op: str, **args: Any) -> str:
        rid = uuid.uuid4().hex
        self._send("comm_msg", {"comm_id": self.comm_id, "data": {"type": "request", "id": rid, "op": op, "args": args}})
        return rid

    def arrival(self, rid: str, kind: str = "reply") -> float:
        return [t for m, t in zip(self.msgs, self.times) if m.get("id") == rid and m.get("type") == kind][0]

    def pump(self, until, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"waited {timeout}s; comm messages so far: {[m.get('type') for m in self.msgs]}")
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 0.2))
            except queue.Empty:
                continue
            c = msg["content"]
            if msg["msg_type"] == "comm_msg" and c.get("comm_id") == self.comm_id:
                self.msgs.append(c["data"])
                self.times.append(time.monotonic())
                self.sent.append(msg["header"]["date"].timestamp())
            elif msg["msg_type"] == "comm_close" and c.get("comm_id") == self.comm_id:
                self.closed = True
            else:
                self.other.append(msg)

    def reply(self, rid: str, timeout: float = 60.0) -> dict:
        found: List[dict] = []

        def got() -> bool:
            found[:] = [m for m in self.msgs if m.get("type") == "reply" and m.get("id") == rid]
            return bool(found)

        self.pump(got, timeout)
        return found[0]

    def snapshots(self) -> List[dict]:
        return [m for m in self.msgs if m.get("type") == "snapshot"]

    def last_pool(self) -> Optional[dict]:
        snaps = self.snapshots()
        assert snaps, "no snapshot arrived"
        return snaps[-1]["pool"]

    def execute(self, code: str) -> str:
        return self.kc.execute(code)

    def wait_idle(self, msg_id: str, timeout: float = 120.0) -> float:
        """Pump until the kernel is idle after msg_id; returns when that was."""
        when: List[float] = []

        def idle() -> bool:
            for m in self.other:
                if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" and m["parent_header"].get("msg_id") == msg_id:
                    when.append(time.monotonic())
                    return True
            return False

        self.pump(idle, timeout)
        self.other.clear()
        return when[0]

    def run(self, code: str, timeout: float = 120.0) -> List[dict]:
        """Execute code; return the iopub messages of that cell other than our comm's."""
        mid = self.execute(code)
        seen: List[dict] = []

        def idle() -> bool:
            for m in self.other:
                if m["parent_header"].get("msg_id") == mid:
                    seen.append(m)
            self.other.clear()
            return any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for m in seen)

        self.pump(idle, timeout)
        errors = [m for m in seen if m["msg_type"] == "error"]
        assert not errors, errors[0]["content"]["evalue"]
        return seen


@pytest.fixture(scope="module")
def front() -> Any:
    k = Kernel()
    f = Front(k)
    yield f
    k.shutdown()


def test_no_target_and_no_comm_traffic_before_the_extension_loads(front: Front) -> None:
    assert front.comm_info() == {}
    seen = front.run("%load_ext ddp_magic")
    assert not [m for m in seen if m["msg_type"].startswith("comm")], "loading the extension must not open a comm towards front ends"
    comms = front.comm_info()
    assert len(comms) == 1 and list(comms.values())[0]["target_name"] == TARGET


def test_a_front_end_that_never_opens_the_comm_gets_no_comm_message(front: Front) -> None:
    # what nbclient, nbval, VS Code and Notebook 7 without the extension see: the magics, nothing else
    seen = front.run("%%ddp -n 2 --no-widget\nimport torch.distributed as dist\nprint('hello', dist.get_rank())")
    assert not [m for m in seen if m["msg_type"].startswith("comm")]
    out = re.sub(r"\x1b\[[0-9;]*m", "", "".join(m["content"]["text"] for m in seen if m["msg_type"] == "stream"))  # prefixes are coloured
    assert "[rank 0] hello 0" in out and "[rank 1] hello 1" in out


def test_open_gets_a_snapshot_of_the_running_pool(front: Front) -> None:
    front.open()
    front.pump(lambda: bool(front.snapshots()), 30)
    snap = front.snapshots()[-1]
    assert snap["protocol"] == 1 and snap["version"]
    assert "state" not in snap, "a top-level 'state' key would be taken for widget state by nbclient"
    pool = snap["pool"]
    assert pool["nproc"] == 2 and pool["world_size"] == 2 and pool["backend"] == "gloo" and pool["started"]
    assert [r["rank"] for r in pool["ranks"]] == [0, 1]
    assert all(isinstance(r["pid"], int) for r in pool["ranks"])
    assert all(r["state"] == "done" for r in pool["ranks"])
    assert pool["ranks"][1]["last_line"] == "hello 1"
    assert pool["checks"] and all(c["ok"] for c in pool["checks"]), pool["checks"]
    assert pool["verdict"] == f"✓ {len(pool['checks'])} checks passed", pool["verdict"]  # the count the cell's view gives
    assert {"name", "ok", "level", "mark", "detail"} <= set(pool["checks"][0])
    assert "dist" in pool["names"]


def test_snapshots_follow_a_running_cell_throttled_and_end_with_a_final_one(front: Front) -> None:
    front.clear()
    code = "%%ddp --no-widget\nimport time\nfor i in range(40):\n    print('step', i, flush=True)\n    time.sleep(0.05)\n"
    front.run(code)
    snaps = front.snapshots()
    states = [tuple(r["state"] for r in s["pool"]["ranks"]) for s in snaps]
    assert ("running", "running") in states, states
    assert states[-1] == ("done", "done")
    assert snaps[-1]["final"] is True
    assert snaps[-1]["pool"]["ranks"][0]["last_line"] == "step 39"
    # 80 printed lines and 4 state changes, yet at most ~4 snapshots a second (plus the final one), by the kernel's send
    # times: a loaded machine delays what this process reads and bunches it, not what the kernel sends
    sent = [t for m, t in zip(front.msgs, front.sent) if m.get("type") == "snapshot"]
    assert len(snaps) <= (sent[-1] - sent[0]) / 0.25 + 3, (len(snaps), sent)
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert sum(1 for g in gaps if g < 0.15) <= 2, gaps  # only the final one may follow closely
    seqs = [s["seq"] for s in snaps]
    assert seqs == sorted(seqs)


def test_a_cell_that_changes_nothing_sends_nothing(front: Front) -> None:
    front.clear()
    front.run("x = 1 + 1")
    assert front.snapshots() == []


LOGS = "%%ddp --no-widget\nimport ddp_magic\nfor i in range(3):\n    ddp_magic.log(step=i, samples_per_s=15900.0 + i)"


def test_a_page_that_connects_later_gets_the_pool_s_last_chart(front: Front) -> None:
    """A reload opens a new comm: it gets the pool's snapshot, then the chart of the last cell that logged."""
    for _ in range(2):  # run twice: the second run's chart replaces the first
        front.clear()
        front.run(LOGS)
        assert [m["final"] for m in front.msgs if m.get("type") == "metrics"][-1] is True
        front.clear()
        front.open()  # the page reloaded
        front.pump(lambda: [m.get("type") for m in front.msgs][:2] == ["snapshot", "metrics"], 30)
        chart = front.msgs[1]
        assert chart["final"] is True and chart["names"] == ["samples_per_s"] and chart["ranks"] == [0, 1]
        assert chart["summary"][0]["last"] == 15902.0 and chart["summary"][0]["min"] == 15900.0
        assert [p[1] for p in chart["series"]["samples_per_s"]["0"]] == [15900.0, 15901.0, 15902.0]


def test_notices_are_forgotten_when_the_next_ddp_cell_runs(front: Front) -> None:
    front.clear()
    front.run("from ddp_magic.ui import labcomm\nlabcomm.notice('the pool restarts with 2 ranks')")
    front.pump(lambda: any(m.get("notices") for m in front.snapshots()), 30)
    front.clear()
    front.run("%%ddp --no-widget\nx = 1")
    assert front.snapshots() and front.snapshots()[-1]["notices"] == []


def test_restart_request_gives_new_pids(front: Front) -> None:
    old = [r["pid"] for r in front.last_pool()["ranks"]] if front.snapshots() else None
    front.run("pass")
    front.clear()
    rid = front.request("restart")
    reply = front.reply(rid)
    assert reply["ok"], reply
    assert "ready in" in reply["message"]
    front.pump(lambda: any(s["final"] for s in front.snapshots()), 30)
    pool = front.last_pool()
    new = [r["pid"] for r in pool["ranks"]]
    assert all(isinstance(p, int) for p in new)
    if old:
        assert set(new).isdisjoint(old)
    assert all(r["state"] == "ready" for r in pool["ranks"])
    assert pool["names"] == []  # a restart loses what the workers owned
    front.clear()
    front.open()  # a reload after the restart: the old pool's chart is not the new pool's
    front.pump(lambda: bool(front.snapshots()), 30)
    front.run("pass")  # every message the open caused has arrived by the next cell's end
    assert [m.get("type") for m in front.msgs] == ["snapshot"], [m.get("type") for m in front.msgs]


def test_env_request_returns_the_live_report(front: Front) -> None:
    front.clear()
    reply = front.reply(front.request("env"))
    assert reply["ok"], reply
    report = reply["report"]
    assert report["checks"] and "verdict" in report
    assert [r.get("RANK") for r in report["ranks"]] == ["0", "1"]


def test_status_and_unknown_requests(front: Front) -> None:
    reply = front.reply(front.request("status"))
    assert reply["ok"] and "rank 1: pid" in reply["output"]
    assert reply["message"].startswith("pool of 2 ranks, backend gloo"), reply["message"]
    bad = front.reply(front.request("format-disk"))
    assert not bad["ok"] and "unknown request" in bad["error"]


def test_a_request_sent_while_a_cell_runs_is_handled_when_it_ends(front: Front) -> None:
    front.clear()
    mid = front.execute("import time; time.sleep(2)")
    time.sleep(0.3)
    rid = front.request("status")
    idle_at = front.wait_idle(mid)
    reply = front.reply(rid)
    got_at = front.times[[i for i, m in enumerate(front.msgs) if m.get("id") == rid][0]]
    assert reply["ok"]
    assert got_at >= idle_at - 0.05, "the shell channel handles the request only after the cell"


def test_over_a_subshell_requests_are_queued_for_the_main_thread(front: Front) -> None:
    """JupyterLab >= 4.4 sends comm messages over a kernel subshell: they arrive while a cell runs."""
    front.subshell = front.create_subshell()
    try:
        front.clear()
        front.open()  # a second comm, on the subshell
        front.pump(lambda: bool(front.snapshots()), 30)
        pids = [r["pid"] for r in front.last_pool()["ranks"]]
        mid = front.execute("import time; time.sleep(3)")
        time.sleep(0.5)
        status = front.request("status")
        front.reply(status, 10)
        rid = front.request("restart")
        front.pump(lambda: any(m.get("type") == "queued" and m.get("id") == rid for m in front.msgs), 10)
        idle_at = front.wait_idle(mid)
        assert front.arrival(status) < idle_at, "status only reads: answered while the cell runs"
        assert front.arrival(rid, "queued") < idle_at, "the kernel says at once that the restart waits (before the cell ends)"
        reply = front.reply(rid)
        assert reply["ok"], reply
        assert front.arrival(rid) >= idle_at - 0.05, "the pool is touched only when the cell has ended"
        front.pump(lambda: any(s["final"] and s["pool"]["ranks"][0]["pid"] not in pids for s in front.snapshots()), 30)
        # idle kernel: a request over the subshell runs at once (on the main thread's loop)
        env = front.reply(front.request("env"), 30)
        assert env["ok"] and env["report"]["checks"]
    finally:
        front.subshell = None
    front.open()  # back to a comm on the main shell for the tests below


def test_over_a_subshell_stacks_and_status_are_answered_while_a_ddp_cell_runs(front: Front) -> None:
    """The panel's Stacks and status while a %%ddp cell runs: the cell's snapshots go out with the main shell as parent,
    and ipykernel >= 7.4 would route the next request there, behind the cell; labcomm keeps it on the subshell."""
    front.subshell = front.create_subshell()
    try:
        front.clear()
        front.open()
        front.pump(lambda: bool(front.snapshots()), 30)
        for _ in range(2):
            front.clear()
            mid = front.execute("%%ddp\nimport time, torch.distributed as dist\nif dist.get_rank() == 1:\n    time.sleep(4)\ndist.barrier()")
            front.pump(lambda: any(not s["final"] and any(r["state"] == "running" for r in s["pool"]["ranks"]) for s in front.snapshots()), 30)
            time.sleep(1.0)  # the ranks are where the cell puts them; snapshots went out meanwhile
            status = front.reply(front.request("status"), 10)
            stacks = front.reply(front.request("stacks"), 10)
            assert status["ok"] and stacks["ok"], (status, stacks)
            assert stacks["message"].startswith("2 ranks in 2 stacks"), stacks["output"]
            assert "--- rank 0 ---" in stacks["output"] and "time.sleep(4)" in stacks["output"] and " in barrier" in stacks["output"]
            assert stacks["groups"] == [[0], [1]]
            running = [s["pool"]["job"]["name"] for s in front.snapshots() if s["pool"] and s["pool"].get("job")]
            assert running and stacks["job"] == running[-1], (stacks.get("job"), running)  # the panel's stale mark goes by it
            assert front.arrival(stacks["id"]) < front.wait_idle(mid), "answered while the cell runs, not after it"
    finally:
        front.subshell = None
    front.open()


def test_stop_request_clears_the_pool_and_a_second_one_says_why(front: Front) -> None:
    reply = front.reply(front.request("stop"))
    assert reply["ok"] and "stopped the pool" in reply["message"]
    front.pump(lambda: front.snapshots() and front.snapshots()[-1]["pool"] is None, 30)
    again = front.reply(front.request("stop"))
    assert again["ok"] and again["message"] == "no pool is running"
    restart = front.reply(front.request("restart"))
    assert not restart["ok"] and "no pool to restart" in restart["error"]
    env = front.reply(front.request("env"))
    assert not env["ok"] and "no pool is running" in env["error"]


def test_a_starting_pool_is_shown_starting_from_the_cell_s_first_moment(front: Front) -> None:
    """The panel must not say "no pool" while the cell's own view says "starting"."""
    for _ in range(2):  # a start after a stop, twice: every start is shown
        front.clear()
        front.run("%%ddp -n 2 --no-widget\nprint('up')")
        pools = [s["pool"] for s in front.snapshots()]
        assert pools and pools[0] is not None, "the first snapshot of the cell already shows the pool"
        starting = [p for p in pools if p is not None and not p["started"]]
        assert starting, [p and p["started"] for p in pools]
        first = starting[0]
        assert [r["state"] for r in first["ranks"]] == ["starting", "starting"], first["ranks"]
        assert first["start_method"] == "fork" and first["start_method_asked"] == "auto"
        final = front.last_pool()
        assert final["started"] and [r["state"] for r in final["ranks"]] == ["done", "done"]
        assert final["start_seconds"] > 0
        front.reply(front.request("stop"))
        front.pump(lambda: front.snapshots()[-1]["pool"] is None, 30)  # the stop's own snapshot comes after its reply


def test_a_failed_cell_names_its_root_cause_and_the_ranks_stopped_because_of_it(front: Front) -> None:
    front.clear()
    code = (
        "%%ddp -n 2 --no-widget\nimport torch, torch.distributed as dist\n"
        "if dist.get_rank() == 1:\n    raise ValueError('bad shard')\ndist.all_reduce(torch.ones(1))"
    )
    mid = front.execute(code)
    front.wait_idle(mid, 180)
    front.pump(lambda: bool(front.snapshots()) and front.snapshots()[-1]["final"], 30)
    pool = front.last_pool()
    # the group re-formed: the pool is ready, and the failure is the last cell's (ui/labsnap.py)
    assert [(r["state"], r.get("cause")) for r in pool["ranks"]] == [("ready", None), ("ready", None)], pool["ranks"]
    last = pool["last_cell"]
    assert (last["ok"], last["recovered"], last["root"]) == (False, True, [1]), last
    assert last["causes"] == {"1": {"kind": "error", "cause": "root"}, "0": {"kind": "interrupted", "cause": "stopped"}}, last
    # the next %%ddp cell is the last cell now: no cause left over from the failed one
    front.clear()
    front.run("%%ddp --no-widget\nprint('again')")
    assert all("cause" not in r for r in front.last_pool()["ranks"]) and front.last_pool()["last_cell"]["ok"] is True
    front.reply(front.request("stop"))


RECORD_COMM_LOG = """import logging
class _Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []
    def emit(self, record):
        self.lines.append(record.getMessage())
_kept = _Kept()
logging.getLogger().addHandler(_kept)
"""


def _widgets_of(front: Front, names: Set[str]) -> Dict[str, str]:
    """Pump until the widget models named have opened; their comm ids by model name."""
    models: Dict[str, str] = {}

    def opened() -> bool:
        for m in front.other:
            c = m["content"]
            if m["msg_type"] == "comm_open" and c.get("target_name") == "jupyter.widget":
                models[c["data"]["state"].get("_model_name", "")] = c["comm_id"]
        return names <= set(models)

    front.pump(opened, 120)
    return models


def _idle(front: Front, mid: str) -> bool:
    return any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" and m["parent_header"].get("msg_id") == mid
               for m in front.other)


def test_the_live_view_s_widgets_take_the_browser_s_late_messages_quietly(front: Front) -> None:
    """Opening the live view's ▾ while a cell runs sends widget updates that wait for the main shell (ipykernel
    routes a comm's messages to the shell that last sent on it: the cell's). They arrive after the cell closed the
    view's widgets; the kernel must not log "No such comm" for them (JupyterLab shows each in its log console)."""
    front.run(RECORD_COMM_LOG)
    for attempt in range(2):  # a cell run twice: each run's view gets its own widgets
        mid = front.execute("%%ddp -n 2\nimport time\ntime.sleep(2.5)")
        models = _widgets_of(front, {"ToggleButtonsModel", "StackModel"})
        # what the browser sends when ▾ is clicked: the toggle's index and click, the jslink's stack index
        for comm_id, data in (
            (models["StackModel"], {"method": "update", "state": {"selected_index": 1}, "buffer_paths": []}),
            (models["ToggleButtonsModel"], {"method": "update", "state": {"index": 1}, "buffer_paths": []}),
            (models["ToggleButtonsModel"], {"method": "custom", "content": {"event": "click"}}),
        ):
            front._send("comm_msg", {"comm_id": comm_id, "data": data})
        front.pump(functools.partial(_idle, front, mid), 120)
        closed = {m["content"]["comm_id"] for m in front.other if m["msg_type"] == "comm_close"}
        assert {models["ToggleButtonsModel"], models["StackModel"]} <= closed, "the settled view leaves no widget behind"
        # the next request on the main shell is handled after those three: the log then holds what they caused
        seen = front.run("print('LOG', [line for line in _kept.lines if 'comm' in line.lower()])\n_kept.lines.clear()")
        out = "".join(m["content"]["text"] for m in seen if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")
        assert "LOG []" in out, f"run {attempt + 1}: the kernel logged {out.strip()}"
        stderr = "".join(m["content"]["text"] for m in front.other + seen if m["msg_type"] == "stream" and m["content"]["name"] == "stderr")
        assert "No such comm" not in stderr, stderr
    front.run("%ddp stop")


def test_unload_closes_the_comm_and_removes_the_target(front: Front) -> None:
    front.run("%unload_ext ddp_magic")
    front.pump(lambda: front.closed, 10)
    assert front.comm_info() == {}


def test_plain_ipython_has_no_comm_and_the_magics_work() -> None:
    code = "%load_ext ddp_magic\nfrom ddp_magic.ui import labcomm\nprint('bridge', labcomm.bridge())\n%ddp status\n"
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "IPython", "--quick", "--no-banner", "--colors=NoColor", "-c", code]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "bridge None" in out.stdout
    assert "no pool is running" in out.stdout


def test_register_without_a_kernel_does_nothing() -> None:
    from types import SimpleNamespace

    from ddp_magic.ui import labcomm

    assert labcomm.register(SimpleNamespace(), object()) is None
    assert labcomm.register(SimpleNamespace(kernel=SimpleNamespace()), object()) is None
    labcomm.changed()  # hooks are no-ops without a bridge
    labcomm.notice("nothing listens")


def test_causes_name_the_root_and_the_ranks_stopped_because_of_it() -> None:
    from ddp_magic.errors import RankFailure
    from ddp_magic.states import FailureKind as K
    from ddp_magic.kernel.failures.blame import causes

    raised = RankFailure(rank=1, kind=K.ERROR, type="ValueError", message="bad shard")
    peer = RankFailure(rank=0, kind=K.ERROR, type="RuntimeError", message="Connection closed by peer")
    killed = RankFailure(rank=2, kind=K.KILLED, exit_code=-15)
    interrupted = RankFailure(rank=3, kind=K.INTERRUPTED)
    assert causes([raised, peer, killed, interrupted]) == {
        1: ("error", "root"), 0: ("error", "stopped"), 2: ("killed", "stopped"), 3: ("interrupted", "stopped"),
    }
    died = RankFailure(rank=3, kind=K.DIED, exit_code=-9)
    assert causes([died, raised])[3] == ("died", "root") and causes([died, raised])[1] == ("error", "stopped")
    assert causes([interrupted]) == {3: ("interrupted", "stopped")}  # Ctrl-C: nobody is the root cause
    assert causes([]) == {}
