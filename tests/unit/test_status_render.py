"""The status view's words and tables (ddp_magic.ui.status_render): pure functions of a Snapshot.

No kernel, no widgets, no clock: a snapshot in, text and HTML out. The presenter
and the widgets are tested in tests/kernel/test_status_view.py.
"""
from __future__ import annotations

import html
import re
import subprocess
import sys
import types
from typing import Any, List

from ddp_magic.kernel import RankInfo
from ddp_magic.plan import DIST_VARS, Check, GPUInfo, PoolSpec, make_plan
from ddp_magic.states import FailureKind, RankState, Waiting
from ddp_magic.ui import status_render as R
from ddp_magic.ui.status import choose_mode

ROW = re.compile(r"data-rank='(\d+)' data-state='([a-z]+)'")
OK_CHECKS = [Check("ranks unique and complete", True, "0..1"), Check("variables set", True, "all set")]


def text_of(fragment: str) -> str:
    """The words of an HTML fragment's first line (its header), as a reader sees them."""
    header = re.sub(r"(?s)<style>.*?</style>", "", fragment).split("</div>", 1)[0]
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", header)).split())


def infos(n: int, state: str = RankState.RUNNING, started: float = 1000.0, **kw: Any) -> List[RankInfo]:
    return [RankInfo(rank=r, state=state, pid=4000 + r, device="cpu", started=started, **kw) for r in range(n)]


def snap(n: int, ranks: List[RankInfo], **kw: Any) -> R.Snapshot:
    kw.setdefault("now", 1003.2)
    kw.setdefault("elapsed", 3.2)
    kw.setdefault("backend", "gloo")
    kw.setdefault("checks", OK_CHECKS)
    return R.Snapshot(nproc=n, infos={i.rank: i for i in ranks}, **kw)


def rank_envs(n: int) -> List[dict]:
    return [{k: v for k, v in env.items() if k in DIST_VARS} for env in make_plan(PoolSpec(n)).all_envs()]


def test_labels():
    assert R.state_label(RankInfo(rank=0, state=RankState.DEAD, exit_code=-9)) == FailureKind.KILLED == "killed"
    assert R.state_label(RankInfo(rank=0, state=RankState.DEAD, exit_code=3)) == FailureKind.DIED
    assert R.state_label(RankInfo(rank=0, state="connecting")) is RankState.CONNECTING
    assert set(R.STATE_COLORS) == (set(RankState) - {RankState.DEAD}) | {FailureKind.KILLED, FailureKind.DIED}


def test_running_summary_counts_states_in_order():
    ranks = infos(4)
    ranks[0].state = ranks[1].state = RankState.DONE
    s = snap(4, ranks)
    assert R.summary(s) == "4 ranks · running 2, done 2 · 3.20 s · gloo · env ✓"
    assert text_of(R.header_html(s)).replace(" ,", ",") == "%%ddp " + R.summary(s)  # each count is its own <span>
    assert "data-state='running'" in R.header_html(s)


def test_finished_summary_text_and_html_agree():
    ok = snap(2, infos(2, state=RankState.DONE), finished=True, ok=True, elapsed=2.31, started_in=1.5)
    assert R.summary(ok) == "2 ranks ✓ 2.31 s · gloo · env ✓ · pool started in 1.50 s"
    assert text_of(R.header_html(ok)) == "%%ddp " + R.summary(ok)
    bad = snap(2, infos(2, state=RankState.FAILED), finished=True, ok=False, note="rank 1 raised ValueError: boom", elapsed=0.5)
    assert R.summary(bad) == "2 ranks ✗ rank 1 raised ValueError: boom · 0.50 s · gloo · env ✓"
    assert text_of(R.header_html(bad)) == "%%ddp " + R.summary(bad)
    assert "data-state='finished'" in R.header_html(bad)
    assert R.static_text(bad).startswith(R.TEXT_PREFIX + R.summary(bad) + "\n")
    assert R.final_text(bad) == R.TEXT_PREFIX + R.summary(bad)


def test_verdict_from_outcome_or_error():
    failure = types.SimpleNamespace(headline=lambda: "rank 1 raised KeyError: 'lost'")
    assert R.verdict(types.SimpleNamespace(ok=False, failures=[failure]), None) == (False, "rank 1 raised KeyError: 'lost'")
    assert R.verdict(types.SimpleNamespace(ok=True, failures=[]), None) == (True, "")
    assert R.verdict(None, RuntimeError("never ran\nmore")) == (False, "RuntimeError: never ran")
    assert R.verdict(None, None) == (False, "the cell did not finish")


def test_rank_table_html_and_text_come_from_the_same_rows():
    ranks = infos(2, state=RankState.DONE, finished=1002.0)
    ranks[1].state, ranks[1].exit_code = RankState.DEAD, -9
    ranks[0].last_line = "hello \x1b[1mworld\x1b[0m"
    s = snap(2, ranks)
    table = R.ranks_html(s)
    assert ROW.findall(table) == [("0", "done"), ("1", "killed")]
    assert ">SIGKILL<" in table and "was killed by SIGKILL" in table  # the cell and its tooltip
    assert ">hello world<" in table and ">4000<" in table and ">2.00 s<" in table
    lines = R.ranks_text(s)
    assert lines[0].split() == ["rank", "state", "time", "device", "pid", "exit", "last", "line"]
    assert lines[1].split() == ["0", "done", "2.00", "s", "cpu", "4000", "hello", "world"]
    assert lines[2].split()[:7] == ["1", "killed", "2.00", "s", "cpu", "4001", "SIGKILL"]
    assert lines[0].index("state") == lines[1].index("done") == lines[2].index("killed"), "columns line up"


def test_a_rank_not_yet_heard_of_is_starting():
    s = snap(3, infos(1))
    assert [r.label for r in R.rank_rows(s)] == [RankState.RUNNING, RankState.STARTING, RankState.STARTING]
    assert R.summary(s).startswith("3 ranks · starting 2, running 1 · ")


def test_sixty_four_ranks_stay_readable():
    ranks = infos(64)
    for info in ranks[:4]:
        info.state = RankState.DONE
    s = snap(64, ranks, envs=rank_envs(64))
    assert R.summary(s).startswith("64 ranks · running 60, done 4 · 3.20 s · gloo")
    table = R.ranks_html(s)
    assert "max-height:20em;overflow:auto" in table and len(ROW.findall(table)) == 64
    assert len(table) < 40_000
    assert R.header_html(s).count("title='rank ") == 64  # one small square per rank
    assert len(R.static_text(s).splitlines()) < 64 + 15
    done = snap(64, infos(64, state=RankState.DONE), finished=True, ok=True, elapsed=3.3)
    assert R.summary(done).startswith("64 ranks ✓ 3.30 s · gloo · env")


def test_gpu_memory_column():
    plan = make_plan(PoolSpec(2, backend="nccl"), gpus=GPUInfo(count=2, cuda_built=True, physical=2), strict=False)
    ranks = [RankInfo(rank=r, state=RankState.DONE, device=f"cuda:{r}", pid=10 + r, memory=(r + 1) * 3 << 29) for r in range(2)]
    table = R.ranks_html(snap(2, ranks, backend=plan.backend))
    assert ">memory<" in table and ">1.5 GiB<" in table and ">3.0 GiB<" in table and ">cuda:1<" in table
    assert ">memory<" not in R.ranks_html(snap(2, infos(2)))


def test_host_column_only_with_more_than_one_host():
    ranks = infos(2)
    assert ">host<" not in R.ranks_html(snap(2, ranks))
    ranks[0].host, ranks[1].host = "node-a", "node-b"
    assert ">host<" in R.ranks_html(snap(2, ranks)) and ">node-b<" in R.ranks_html(snap(2, ranks))


def test_env_section_shows_variables_and_failing_checks_first():
    checks = [Check("ranks unique and complete", False, "rank(s) [1] appear more than once"), Check("variables set", True, "all set")]
    s = snap(2, infos(2), checks=checks, envs=rank_envs(2))
    env = R.env_html(s)
    for var in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        assert f">{var}<" in env
    assert env.index("appear more than once") < env.index("all set")
    assert "data-check='ranks unique and complete' data-ok='false'" in env
    assert "env ✗ 1 failed" in R.header_html(s)
    text = R.static_text(s)
    assert "✗ ranks unique and complete: rank(s) [1] appear more than once" in text
    assert "  env ✗ 1 failed: 1 of 2 checks passed" in text
    assert "RANK, LOCAL_RANK = rank (0..1)" in text


def test_static_html_holds_the_summary_and_both_sections():
    s = snap(2, infos(2), envs=rank_envs(2))
    page = R.static_html(s)
    assert page.startswith("<div class='ddp-status'") and text_of(page) == "%%ddp " + R.summary(s)
    assert page.count("<details>") == 2 and "ddp-status-ranks" in page and "ddp-status-env" in page
    brief = R.brief_html(s)
    assert text_of(brief) == text_of(page) and "<details>" not in brief


def test_notices_show_under_the_summary():
    s = snap(2, infos(2), notices=["one", "two", "three", "restarted the pool"])
    header = R.header_html(s)
    assert "restarted the pool" in header and ">one<" not in header  # the last three
    assert "  restarted the pool" in R.static_text(s).splitlines()


def test_formatting():
    assert [R.fmt_seconds(x) for x in (None, 2.314, 75, 3725)] == ["", "2.31 s", "1 m 15 s", "1 h 02 m"]
    assert [R.fmt_bytes(x) for x in (None, 512, 2048, 3 << 29)] == ["", "512 B", "2.0 KiB", "1.5 GiB"]
    assert R.clean_line("\x1b[31mred\tline\x1b[0m  ") == "red line"
    assert R.clean_line("x" * 200, 10) == "x" * 9 + "…"
    assert R.exit_text(RankInfo(rank=0, state=RankState.DEAD, exit_code=-99)) == "signal 99"
    assert R.exit_text(RankInfo(rank=0, state=RankState.DONE, exit_code=0)) == ""


def test_choose_mode(monkeypatch):
    assert choose_mode(enabled=False) == "off"
    assert choose_mode(environ={"DDP_MAGIC_WIDGET": "0"}) == "off"
    assert choose_mode(environ={}) == "off"  # no IPython shell in this process
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(kernel=None))
    assert choose_mode(environ={}) == "text"
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(kernel=object()))
    assert choose_mode(environ={}) == ("widget" if _has("ipywidgets") else "html")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_importing_the_status_view_does_not_import_ipywidgets():
    code = "import sys, ddp_magic, ddp_magic.magics, ddp_magic.ui.status\nprint('ipywidgets' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_a_rank_in_the_debugger_is_named_and_the_others_wait():
    ranks = infos(4)
    ranks[1].debugging = Waiting.DEBUGGER
    s = snap(4, ranks)
    assert R.debugging_text(s) == "rank 1 in debugger, 3 waiting"
    assert "rank 1 in debugger, 3 waiting" in R.summary(s)
    ranks[2].debugging = Waiting.INPUT
    ranks[3].state = RankState.DONE
    assert R.debugging_text(snap(4, ranks)) == "rank 1 in debugger, rank 2 waiting for input, 1 waiting"
    ranks[1].debugging = ranks[2].debugging = Waiting.NO
    assert R.debugging_text(snap(4, ranks)) == ""
