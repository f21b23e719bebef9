"""A page that reloads while a background cell runs gets the cell back whole (ui/transcripts.py).

A real kernel, a real pool of 2 ranks. The test plays two pages. The first runs the background cell (an execute
request whose metadata names the cell's id, as JupyterLab sends it) and opens the ddp_magic comm; then it goes
away (its comm closes: a reload) while the job runs. The second page opens a new comm, finds the cell in the
snapshot's ``cells`` (its id, the page that ran it, not ended) and follows it: the reply's outputs, then the
``cell_output`` messages. What the second page then shows is compared with what the first page's output area
would show had it stayed (every iopub message of the cell, applied as JupyterLab's output area applies them), and
against what the ranks printed: each line exactly once, the settled status view and the chart at the end. The job
goes on for more than 10 s after the "reload". The live ``metrics`` messages name the cell (In [n]), so the panel
shows the job's chart while it logs rather than the last foreground cell's. Each round runs twice.
"""
from __future__ import annotations

import re
import time
import uuid
from typing import Any, Dict, List

import pytest

from kernel_helper import Kernel
from test_background import Gates
from test_lab_comm import Front

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

STEPS, GATE_AT, AFTER_S = 60, 20, 12.0  # the job runs on for ~12 s after the gate opens (the reload)
BG = """%%ddp --bg --out job
import os, time, ddp_magic
rank = dist.get_rank()
for step in range({steps}):
    while step == {at} and os.path.exists({gate!r}):
        time.sleep(0.01)
    if step > {at}:
        time.sleep({pause})
    print(f"r{{rank}} step {{step}}", flush=True)
    ddp_magic.log(step=step, loss=1.0 / (step + 1) + rank)
"""
FOREGROUND = "%%ddp\nfor step in range(5):\n    ddp_magic.log(step=step, x=float(step))"


def apply(outputs: List[Dict[str, Any]], ids: Dict[str, List[int]], msg_type: str, content: Dict[str, Any]) -> None:
    """One output message applied as JupyterLab's OutputArea applies it (labextension/src/rebind.ts does the same)."""
    did = (content.get("transient") or {}).get("display_id")
    if msg_type == "clear_output":
        outputs.clear()
        ids.clear()
    elif msg_type == "update_display_data":
        for i in ids.get(did, []):
            outputs[i] = {"output_type": "display_data", "data": content["data"]}
    elif msg_type == "stream" and outputs and outputs[-1]["output_type"] == "stream" and outputs[-1]["name"] == content["name"]:
        outputs[-1]["text"] += content["text"]
    elif msg_type in ("stream", "display_data", "execute_result", "error"):
        shown = {"output_type": msg_type, **{k: v for k, v in content.items() if k in ("name", "text", "data", "ename", "evalue")}}
        outputs.append(shown)
        if did and msg_type == "display_data":
            ids.setdefault(did, []).append(len(outputs) - 1)


def shown(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    outputs: List[Dict[str, Any]] = []
    ids: Dict[str, List[int]] = {}
    for m in messages:
        apply(outputs, ids, m["msg_type"], m["content"])
    return outputs


def execute(front: Front, code: str, cell_id: str) -> str:
    """An execute request as JupyterLab sends it: the cell's id in its metadata."""
    msg = front.kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                                                   "allow_stdin": False, "stop_on_error": True}, metadata={"cellId": cell_id})
    front.kc.shell_channel.send(msg)
    return msg["header"]["msg_id"]


class Page(Front):
    """The test's front end, which also keeps every iopub message of the background cell (``bg``): Front.run clears
    what it reads of other cells."""

    bg_id = ""

    def __init__(self, kernel: Kernel) -> None:
        super().__init__(kernel)
        self.bg: List[Dict[str, Any]] = []

    def pump(self, until: Any, timeout: float = 60.0) -> None:
        def check() -> bool:
            mine = [m for m in self.other if m["parent_header"].get("msg_id") == self.bg_id]
            if mine:
                self.bg += mine
                self.other[:] = [m for m in self.other if m["parent_header"].get("msg_id") != self.bg_id]
            return bool(until())

        super().pump(check, timeout)

    def settle(self, seconds: float) -> None:
        """Read what arrives for ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            self.pump(lambda: time.monotonic() >= deadline, seconds + 5)
        except TimeoutError:
            pass

    def idle(self, msg_id: str, timeout: float = 120.0) -> None:
        self.pump(lambda: any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" and m["parent_header"].get("msg_id") == msg_id
                              for m in self.bg), timeout)


@pytest.fixture(scope="module")
def front() -> Any:
    k = Kernel()
    f = Page(k)
    f.run("%load_ext ddp_magic")
    f.run("%%ddp -n 2 --no-widget\nimport torch.distributed as dist, ddp_magic")
    yield f
    k.shutdown()


def test_a_page_that_reloads_during_a_bg_job_gets_the_cell_back_whole_and_its_live_chart_is_the_jobs(front, tmp_path):
    for round_ in range(2):
        _reload_round(front, tmp_path, round_)


def _reload_round(front: Page, tmp_path: Any, round_: int) -> None:
    gate = Gates(tmp_path, f"gate{round_}").close()
    front.open()  # the first page
    front.run(FOREGROUND)  # a logging cell before: its final chart is what the panel shows until the job logs
    front.clear()
    cell_id = f"bg-cell-{uuid.uuid4().hex[:8]}"
    front.bg_id, front.bg = execute(front, BG.format(steps=STEPS, at=GATE_AT, gate=gate[f"gate{round_}"], pause=AFTER_S / (STEPS - GATE_AT)), cell_id), []
    mid = front.bg_id
    front.idle(mid)
    def ours() -> List[Dict[str, Any]]:
        return front.bg

    def printed() -> str:
        return "".join(m["content"]["text"] for m in ours() if m["msg_type"] == "stream")

    front.pump(lambda: f"r1 step {GATE_AT - 1}" in printed() and f"r0 step {GATE_AT - 1}" in printed(), 120)
    cells = [c for c in front.snapshots()[-1]["cells"] if c["msg_id"] == mid]
    assert cells and cells[0]["cell_id"] == cell_id and cells[0]["client"] == front.kc.session.session and not cells[0]["ended"], cells
    name = cells[0]["name"]
    number = re.fullmatch(r"cell \[(\d+)\]", name).group(1)

    front._send("comm_close", {"comm_id": front.comm_id, "data": {}})  # the reload: the first page goes
    front.open()  # the second page
    front.clear()
    front.pump(lambda: bool(front.snapshots()), 30)
    assert any(c["msg_id"] == mid and not c["ended"] for c in front.snapshots()[-1]["cells"]), front.snapshots()[-1]["cells"]
    rid = front.request("follow", msg_id=mid)
    gate.open(f"gate{round_}")  # the job goes on: ~12 s more
    reply = front.reply(rid)
    assert reply["ok"] and reply["cell_id"] == cell_id and not reply["ended"], {k: v for k, v in reply.items() if k != "outputs"}
    front.run(f"job.wait({AFTER_S * 10})", timeout=AFTER_S * 10 + 30)
    front.pump(lambda: "ddp_magic metrics" in str(shown(ours())), 30)
    front.settle(1.5)  # the last stream flush and its cell_output message

    deltas = [m for m in front.msgs if m.get("type") == "cell_output" and m["msg_id"] == mid]
    seqs = [d["seq"] for d in deltas]
    assert seqs == list(range(reply["seq"] + 1, reply["seq"] + 1 + len(seqs))), seqs  # none lost, none twice, in order
    reloaded = shown([{"msg_type": o["msg_type"], "content": o["content"]} for o in reply["outputs"]] + deltas)
    truth = shown(ours())
    assert reloaded == truth  # exactly what the page that stayed would show
    text = "".join(o.get("text", "") for o in reloaded if o["output_type"] == "stream")
    for r in (0, 1):
        for step in range(STEPS):
            assert len(re.findall(rf"\br{r} step {step}\n", text)) == 1, (r, step, text[-2000:])
    htmls = [o["data"].get("text/html", "") for o in reloaded if o["output_type"] == "display_data"]
    assert any(f"steps 0-{STEPS - 1}" in h and "ddp_magic metrics: loss from 2 ranks" in h for h in htmls), htmls  # the settled chart
    assert not any(o["output_type"] == "error" for o in reloaded)

    live = [m for m in front.msgs if m.get("type") == "metrics" and not m["final"]]
    assert live and all(m["cell"] == number for m in live), [m["cell"] for m in live]  # item 3: the job's own cell, not ''
    final = [m for m in front.msgs if m.get("type") == "metrics" and m["final"]]
    assert final and final[-1]["cell"] == number and final[-1]["summary"][0]["steps"] == [0, STEPS - 1]
    front.pump(lambda: any(c["msg_id"] == mid and c["ended"] for c in front.snapshots()[-1]["cells"]), 30)
    front._send("comm_close", {"comm_id": front.comm_id, "data": {}})
