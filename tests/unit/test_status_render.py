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
from ddp_magic.ui import status_compact as C
from ddp_magic.ui import status_render as R
from ddp_magic.ui import status_tables as T
from ddp_magic.ui.progress import Bar, LiveLines, parse_bar
from ddp_magic.ui.status import choose_mode
from format_patterns import CLOCK, SECONDS, seconds_range

ROW = re.compile(r"data-rank='(\d+)' data-state='([a-z]+)'")
OK_CHECKS = [Check("ranks unique and complete", True, "0..1"), Check("variables set", True, "all set")]


def text_of(fragment: str) -> str:
    """The words of an HTML fragment's summary line (its header), as a reader sees them."""
    header = fragment.split("</summary>", 1)[0] if "<summary" in fragment else fragment
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
    assert set(R.STATE_TONES) == (set(RankState) - {RankState.DEAD}) | {FailureKind.KILLED, FailureKind.DIED, FailureKind.TIMEOUT}
    assert R.STATE_TONES[RankState.FAILED] != R.STATE_TONES[FailureKind.KILLED], "killed and failed are told apart"


def test_running_summary_counts_states_in_order():
    ranks = infos(4)
    ranks[0].state = ranks[1].state = RankState.DONE
    s = snap(4, ranks)
    assert R.summary(s) == "4 ranks · running 2, done 2 · 3.2 s · gloo · ✓ 2 checks passed"  # a live clock, in tenths
    assert text_of(R.header_html(s)).replace(" ,", ",") == "%%ddp " + R.summary(s)  # each count is its own <span>
    assert "data-state='running'" in R.header_html(s)


def test_one_clock_start_time_apart():
    """The plain seconds are always the run time; the pool's start has its own labelled clock. A live clock says
    tenths (it moves ten times a second); a time that ended says fmt_seconds ('5.40 s', '998 ms')."""
    starting = snap(2, infos(2, state=RankState.STARTING), elapsed=0.0, starting_for=5.43)
    assert R.summary(starting) == "2 ranks · starting 2 · start 5.4 s · gloo · ✓ 2 checks passed"
    running = snap(2, infos(2), elapsed=0.08, started_in=5.4)
    assert R.summary(running) == "2 ranks · running 2 · 0.1 s · gloo · ✓ 2 checks passed · pool started in 5.40 s"
    quick_start = snap(2, infos(2), elapsed=1.0, started_in=0.998)
    assert R.summary(quick_start).endswith(" · pool started in 998 ms")
    quick = snap(2, infos(2, state=RankState.DONE), finished=True, ok=True, elapsed=0.0004)
    assert R.summary(quick).startswith("2 ranks ✓ <1 ms · ")
    assert "0.00 s" not in R.summary(snap(2, infos(2, state=RankState.DONE), finished=True, ok=True, elapsed=0.004))


def test_finished_summary_text_and_html_agree():
    ok = snap(2, infos(2, state=RankState.DONE), finished=True, ok=True, elapsed=2.31, started_in=1.5)
    assert R.summary(ok) == "2 ranks ✓ 2.31 s · gloo · ✓ 2 checks passed · pool started in 1.50 s"
    assert text_of(R.header_html(ok)) == "%%ddp " + R.summary(ok)
    bad = snap(2, infos(2, state=RankState.FAILED), finished=True, ok=False, note="rank 1 raised ValueError: boom", elapsed=0.5)
    assert R.summary(bad) == "2 ranks ✗ rank 1 raised ValueError: boom · 500 ms · gloo · ✓ 2 checks passed"
    assert text_of(R.header_html(bad)) == "%%ddp " + R.summary(bad)
    assert "data-state='finished'" in R.header_html(bad)
    assert "data-outcome='failed'" in T.static_html(bad) and "data-outcome='ok'" in T.static_html(ok)
    assert T.static_text(bad).startswith(R.TEXT_PREFIX + R.summary(bad) + "\n")
    assert T.final_text(bad) == R.TEXT_PREFIX + R.summary(bad)


def test_the_root_cause_alone_is_failed_the_others_stopped():
    ranks = infos(4, finished=1002.0)
    ranks[1].state = RankState.FAILED
    ranks[0].state = RankState.INTERRUPTED
    ranks[2].state, ranks[2].exit_code = RankState.DEAD, -15
    ranks[3].state, ranks[3].exit_code = RankState.DEAD, -9
    s = snap(4, ranks, root=1, stopped=frozenset({0, 2, 3}), finished=True, ok=False, note="rank 1 raised ValueError: boom")
    assert ROW.findall(T.ranks_html(s)) == [("0", "stopped"), ("1", "failed"), ("2", "stopped"), ("3", "stopped")]
    assert [sq for sq in re.findall(r"data-rank='(\d)' data-state='(\w+)'", R.header_html(s))] == ROW.findall(T.ranks_html(s))
    alone = snap(4, ranks)  # no root cause known (e.g. the user interrupted): the states as they are
    assert ROW.findall(T.ranks_html(alone))[0] == ("0", "interrupted")
    assert R.root_rank(types.SimpleNamespace(failures=[types.SimpleNamespace(rank=1), types.SimpleNamespace(rank=0)])) == 1


def test_every_root_cause_keeps_its_label_once_the_cell_ended():
    """A timeout that blames two hung ranks (kernel.failures.policy.causes: both "root") shows both alike, not the second
    as "stopped" behind the first; while the cell runs, the first failure is the root and the others wait."""
    ranks = infos(3, finished=1002.0)
    ranks[0].state = ranks[1].state = RankState.INTERRUPTED
    ranks[2].state = RankState.INTERRUPTED
    ended = snap(3, ranks, root=0, stopped=frozenset({2}), finished=True, ok=False, note="the cell ran past --timeout 2s")
    assert ROW.findall(T.ranks_html(ended)) == [("0", "interrupted"), ("1", "interrupted"), ("2", "stopped")]
    running = snap(3, ranks, root=0)
    assert ROW.findall(T.ranks_html(running)) == [("0", "interrupted"), ("1", "stopped"), ("2", "stopped")]


def test_the_rank_a_timeout_waited_for_reads_as_timed_out_not_interrupted():
    """--timeout 2: rank 1 slept, rank 0 waited in a barrier; causes() blames rank 1 ("timeout", root) and releases
    rank 0. The cell's view says so (rank 1 "timeout" in the failure tone), as the message and the panel do."""
    ranks = infos(2, finished=1002.0)
    ranks[0].state = ranks[1].state = RankState.INTERRUPTED
    found = {1: ("timeout", "root"), 0: ("interrupted", "stopped")}
    stopped, timed_out = R.by_cause(found)
    assert (stopped, timed_out) == (frozenset({0}), frozenset({1}))
    ended = snap(2, ranks, root=1, stopped=stopped, timed_out=timed_out, finished=True, ok=False, note="the cell ran past --timeout 2s")
    assert ROW.findall(T.ranks_html(ended)) == [("0", "stopped"), ("1", "timeout")]
    assert R.tone_of(ended.label(1)) == "fail" and R.tone_of(ended.label(0)) == "neutral"


def test_verdict_from_outcome_or_error():
    failure = types.SimpleNamespace(headline=lambda: "rank 1 raised KeyError: 'lost'")
    assert R.verdict(types.SimpleNamespace(ok=False, failures=[failure]), None) == (False, "rank 1 raised KeyError: 'lost'")
    assert R.verdict(types.SimpleNamespace(ok=True, failures=[]), None) == (True, "")
    assert R.verdict(None, RuntimeError("never ran\nmore")) == (False, "RuntimeError: never ran")
    assert R.verdict(None, None) == (False, "the cell did not finish")


def test_every_rank_failing_the_same_way_is_said_in_rank_order():
    from ddp_magic.errors import RankFailure

    def boom(rank: int, message: str = "boom") -> RankFailure:
        return RankFailure(rank=rank, kind=FailureKind.ERROR, type="ValueError", message=message)

    arrived = [boom(1), boom(3), boom(0), boom(2)]  # the policy lists them as their reports came
    assert R.verdict(types.SimpleNamespace(ok=False, failures=arrived), None) == (False, "ranks 0-3 raised ValueError: boom")
    assert R.verdict(types.SimpleNamespace(ok=False, failures=[boom(1), boom(0, "other")]), None)[1] == "rank 1 raised ValueError: boom"
    died = RankFailure(rank=1, kind=FailureKind.DIED, pid=7, exit_code=3)
    assert R.verdict(types.SimpleNamespace(ok=False, failures=[died, boom(0)]), None)[1] == died.headline(), "a root cause of its own"


def test_rank_table_html_and_text_come_from_the_same_rows():
    ranks = infos(2, state=RankState.DONE, finished=1002.0)
    ranks[1].state, ranks[1].exit_code = RankState.DEAD, -9
    ranks[0].last_line = "hello \x1b[1mworld\x1b[0m"
    s = snap(2, ranks)
    table = T.ranks_html(s)
    assert ROW.findall(table) == [("0", "done"), ("1", "killed")]
    assert ">SIGKILL<" in table and "was killed by SIGKILL" in table  # the cell and its tooltip
    assert ">hello world<" in table and ">4000<" in table and ">2.00 s<" in table
    lines = T.ranks_text(s)
    assert lines[0].split() == ["rank", "state", "time", "device", "pid", "exit", "last", "line"]
    assert lines[1].split() == ["0", "done", "2.00", "s", "cpu", "4000", "hello", "world"]
    assert lines[2].split()[:7] == ["1", "killed", "2.00", "s", "cpu", "4001", "SIGKILL"]
    assert lines[0].index("state") == lines[1].index("done") == lines[2].index("killed"), "columns line up"


def test_the_last_line_is_the_newest_output_even_a_redraw():
    ranks = infos(2)
    ranks[0].last_line = "step 9"  # what the pool saw last as a complete line
    live = LiveLines()
    live.feed(0, "stderr", "step 9\n\rtrain:  50%|##   | 5/10 [00:01<00:01, 4.90it/s]")
    s = snap(2, ranks, lines=live.lines, bars=live.bars)
    row = T.rank_row(s, 0)
    assert row.cells["last line"].startswith("train:  50%") and row.cells["progress"] == "train 50% 5/10 4.90 it/s"
    assert "progress" in T.row_columns(T.rank_rows(s))
    strip = R.header_html(s)
    assert "class='ddp-status-bar' data-rank='0' data-n='5' data-total='10'" in strip and "width:50%" in strip


def test_tqdm_lines_parse_into_bars():
    assert parse_bar("epoch 2:  37%|###7      | 37/100 [00:01<00:02, 30.12it/s]") == Bar(37, 100, "30.12it/s", "epoch 2")
    assert parse_bar(" 12%|#2        | 1.2k/10.0k [00:01<00:08, 1.1kit/s]") == Bar(1200, 10000, "1.1kit/s", "")
    assert parse_bar("5it [00:00, 980.2it/s]") == Bar(5, None, "980.2it/s", "")
    assert parse_bar("loss 0.31 at step 5/10") is None and parse_bar("") is None


def test_a_rank_not_yet_heard_of_is_starting():
    s = snap(3, infos(1))
    assert [r.label for r in T.rank_rows(s)] == [RankState.RUNNING, RankState.STARTING, RankState.STARTING]
    assert R.summary(s).startswith("3 ranks · starting 2, running 1 · ")


def test_thirty_two_ranks_keep_a_square_and_a_row_each():
    ranks = infos(32)
    for info in ranks[:4]:
        info.state = RankState.DONE
    s = snap(32, ranks, envs=rank_envs(32))
    assert R.summary(s).startswith("32 ranks · running 28, done 4 · 3.2 s · gloo")
    table = T.ranks_html(s)
    assert "max-height:20em;overflow:auto" in table and len(ROW.findall(table)) == 32
    assert R.header_html(s).count("title='rank ") == 32  # one small square per rank
    assert "ddp-status-grid" not in T.body_html(s) and "ddp-status-segment" not in R.header_html(s)


def test_sixty_four_ranks_are_summarised():
    ranks = infos(64)
    for info in ranks[:4]:
        info.state = RankState.DONE
    s = snap(64, ranks, envs=rank_envs(64))
    assert R.summary(s).startswith("64 ranks · running 60, done 4 · 3.2 s · ranks 0-3 done · gloo")
    assert "title='rank " not in R.header_html(s) and R.header_html(s).count("ddp-status-segment") == 2
    assert len(ROW.findall(T.ranks_html(s))) == 4  # the odd ranks' own rows; the others are counted
    assert len(T.static_text(s).splitlines()) < 20
    done = snap(64, infos(64, state=RankState.DONE), finished=True, ok=True, elapsed=3.3)
    assert R.summary(done).startswith("64 ranks ✓ 3.30 s · gloo · ✓ 2 checks")


def thousand(n: int = 1024) -> List[RankInfo]:
    """1,024 ranks on 4 nodes: rank 517 failed, 3 and 9 done early, the others running."""
    ranks = infos(n)
    for info in ranks:
        info.host = f"node{info.rank // 256}"
        info.last_line = f"step {info.rank}"
    ranks[517].state = RankState.FAILED
    ranks[3].state = ranks[9].state = RankState.DONE
    return ranks


def test_a_thousand_ranks_summarised_in_the_line():
    s = snap(1024, thousand(), root=517)
    assert R.summary(s) == "1024 ranks · running 1021, done 2, failed 1 · 3.2 s · ranks 3, 9 done; rank 517 failed · gloo · ✓ 2 checks passed"
    header = R.header_html(s)
    segments = re.findall(r"class='ddp-status-segment' data-state='([a-z]+)' data-count='(\d+)'", header)
    assert segments == [("running", "1021"), ("done", "2"), ("failed", "1")]
    assert text_of(header).replace(" ,", ",") == "%%ddp " + R.summary(s) and len(header) < 4_000  # the same words as the text


def test_a_thousand_ranks_open_as_node_rows_a_grid_and_the_odd_ranks():
    s = snap(1024, thousand(), root=517)
    body = T.body_html(s)
    groups = re.findall(r"<tr data-state='([a-z]+)' data-count='(\d+)'>", body.split("ddp-status-groups", 1)[1])
    assert groups == [("running", "254"), ("done", "2"), ("running", "256"), ("running", "255"), ("failed", "1"), ("running", "256")]
    grid = body.split("ddp-status-grid", 1)[1].split("ddp-status-ranks", 1)[0]
    assert html.unescape(re.sub(r"<[^>]+>", "", grid)).count("■") == 1024 and grid.count("<div title='ranks ") == 16
    assert ROW.findall(body.split("ddp-status-ranks", 1)[1]) == [("3", "done"), ("9", "done"), ("517", "failed")]
    assert len(body) < 20_000
    text = T.static_text(s).splitlines()
    assert text[1].split() == ["node", "state", "count", "ranks"] and text[2].split() == ["node0", "running", "254", "0-2,", "4-8,", "10-255"]
    assert [ln.split()[:2] for ln in text[8:11]] == [["rank", "state"], ["3", "done"], ["9", "done"]] and text[11].split()[:2] == ["517", "failed"]
    assert len(text) < 20


def test_a_thousand_ranks_at_the_end_name_the_root_once():
    stopped = frozenset(r for r in range(1024) if r != 517)
    s = snap(1024, thousand(), root=517, finished=True, note="rank 517 raised ValueError: boom", stopped=stopped, elapsed=2.0)
    assert R.summary(s) == "1024 ranks ✗ rank 517 raised ValueError: boom · 2.00 s · gloo · ✓ 2 checks passed"
    assert ROW.findall(T.ranks_html(s).split("ddp-status-ranks", 1)[1]) == [("517", "failed")]


def test_many_odd_ranks_are_cut_and_counted():
    ranks = infos(1024)
    for r in range(0, 1024, 16):  # 64 failed ranks, none next to another
        ranks[r].state = RankState.FAILED
    s = snap(1024, ranks)
    assert "ranks 0, 16, 32, 48 and 60 more failed" in R.summary(s)
    assert len(ROW.findall(T.ranks_html(s))) == C.DETAIL_ROWS
    assert C.short_list([0, 1, 2, 5, 7, 9, 11]) == "0-2, 5, 7, 9 and 1 more" and C.short_list(range(1024)) == "0-1023"


def test_the_view_over_1024_ranks_stays_small_in_the_worst_case():
    ranks = infos(1024)
    for info in ranks[::2]:
        info.state = RankState.DONE  # alternating states: a run per square
    s = snap(1024, ranks)
    body = T.body_html(s)
    assert len(body) < 100_000 and len(R.header_html(s)) < 4_000 and not ROW.findall(body)  # half and half: nobody is odd
    assert "running 512, done 512" in R.summary(s)


def test_gpu_memory_column():
    plan = make_plan(PoolSpec(2, backend="nccl"), gpus=GPUInfo(count=2, cuda_built=True, physical=2), strict=False)
    ranks = [RankInfo(rank=r, state=RankState.DONE, device=f"cuda:{r}", pid=10 + r, memory=(r + 1) * 3 << 29) for r in range(2)]
    table = T.ranks_html(snap(2, ranks, backend=plan.backend))
    assert ">memory<" in table and ">1.5 GiB<" in table and ">3.0 GiB<" in table and ">cuda:1<" in table
    assert ">memory<" not in T.ranks_html(snap(2, infos(2)))


def test_host_column_only_with_more_than_one_host():
    ranks = infos(2)
    assert ">host<" not in T.ranks_html(snap(2, ranks))
    ranks[0].host, ranks[1].host = "node-a", "node-b"
    assert ">host<" in T.ranks_html(snap(2, ranks)) and ">node-b<" in T.ranks_html(snap(2, ranks))


def test_env_section_says_the_verdict_and_only_the_problems_first():
    checks = [Check("ranks unique and complete", False, "rank 1 appears more than once"), Check("variables set", True, "all set")]
    envs = rank_envs(2)
    s = snap(2, infos(2), checks=checks, envs=envs)
    env = T.env_html(s)
    visible, behind = env.split("<details>", 1)
    assert "✗ 1 of 2 checks failed" in visible and "appears more than once" in visible and "all set" not in visible
    # the variables one click away: what every rank shares once, a table of what differs by rank
    common = html.unescape(re.sub(r"<[^>]+>", "", re.search(r"<div class='ddp-env-common'[^>]*>(.*?)</div>", behind).group(1)))
    shared = dict(kv.split("=", 1) for kv in common.removeprefix("every rank: ").split())
    assert shared == {k: envs[0][k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK")}
    assert re.findall(r"<th[^>]*>([A-Z_]+)</th>", behind) == ["RANK", "LOCAL_RANK"]
    body = behind.split("<tbody>", 1)[1]
    assert [re.findall(r"<td[^>]*>(\d+)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body)] == [["0", "0"], ["1", "1"]]
    assert "all set" in behind and "data-check='ranks unique and complete' data-ok='false'" in env
    assert "✗ 1 of 2 checks failed" in R.header_html(s)
    healthy = T.env_html(snap(2, infos(2), envs=rank_envs(2))).split("<details>", 1)[0]
    assert "✓ 2 checks passed" in healthy and "<li" not in healthy
    text = T.static_text(s)
    assert "✗ ranks unique and complete: rank 1 appears more than once" in text
    assert "  ✗ 1 of 2 checks failed" in text
    assert "RANK, LOCAL_RANK = rank (0..1)" in text


def test_static_html_is_one_disclosure_line():
    s = snap(2, infos(2), envs=rank_envs(2))
    page = T.static_html(s)
    assert page.startswith("<div class='ddp-status' ") and text_of(page) == "%%ddp " + R.summary(s)
    assert page.count("<details class='ddp-status-details'>") == 1 and "ddp-status-ranks" in page and "ddp-status-env" in page
    brief = T.brief_html(s)
    assert text_of(brief) == text_of(page) and "ddp-status-ranks" not in brief


def test_notices_are_in_the_body_not_the_line():
    s = snap(2, infos(2), notices=["one", "two", "three", "restarted the pool"])
    assert "restarted the pool" not in R.header_html(s), "the line keeps one height"
    body = T.body_html(s)
    assert "restarted the pool" in body and ">one<" not in body  # the last three
    assert "  restarted the pool" in T.static_text(s).splitlines()


def test_extra_sections_render_in_the_body_and_the_text():
    section = ("metrics", lambda s: f"<svg data-n='{s.nproc}'></svg>", lambda s: ["loss 0.1"])
    s = snap(2, infos(2), sections=[section])
    assert "<div class='ddp-status-section' data-title='metrics'><svg data-n='2'></svg></div>" in T.body_html(s)
    assert "  loss 0.1" in T.static_text(s).splitlines()


def test_no_style_blocks_anywhere():
    """Untrusted notebooks drop <style> elements: every style we emit is inline."""
    from ddp_magic.ui.report import plan_report

    ranks = infos(4)
    ranks[2].state, ranks[2].exit_code = RankState.DEAD, -9
    live = LiveLines()
    live.feed(1, "stderr", "\r 50%|##  | 5/10 [00:01<00:01, 4.90it/s]")
    s = snap(4, ranks, envs=rank_envs(4), notices=["n"], lines=live.lines, bars=live.bars)
    report = plan_report(make_plan(PoolSpec(2)))
    pages = [T.static_html(s), T.brief_html(s), T.body_html(s), R.header_html(s), report._repr_html_()]
    for page in pages:
        assert "<style" not in page.lower()


def test_formatting():
    assert [R.fmt_seconds(x) for x in (None, 0.0, 0.0004, 0.012, 2.314, 75, 3725)] == ["", "<1 ms", "<1 ms", "12 ms", "2.31 s", "1 m 15 s", "1 h 02 m"]
    assert [R.fmt_bytes(x) for x in (None, 512, 2048, 3 << 29)] == ["", "512 B", "2.0 KiB", "1.5 GiB"]
    assert R.clean_line("\x1b[31mred\tline\x1b[0m  ") == "red line"
    assert R.clean_line("x" * 200, 10) == "x" * 9 + "…"
    assert R.exit_text(RankInfo(rank=0, state=RankState.DEAD, exit_code=-99)) == "signal 99"
    assert R.exit_text(RankInfo(rank=0, state=RankState.DONE, exit_code=0)) == ""


def _durations() -> List[float]:
    """Every kind of duration the formatters meet: 0, sub-millisecond, the unit edges, seconds to days."""
    values = [0.0, 0.0004, 0.0005, 0.001, 0.0015, 0.9994, 0.9995, 0.9996, 1.0, 59.994, 59.996, 60.0, 3599.4, 3599.6, 86399.0]
    x = 1e-5
    while x < 3e5:
        values += [x, x * 1.7, x * 3.3]
        x *= 10
    return values


def test_the_shared_patterns_accept_every_output_and_it_means_the_value():
    """tests/format_patterns.py is what tests match times with: it must take every output of the formatter, and the
    number shown must be the duration (arithmetic, not the formatter's own word)."""
    for x in _durations():
        for fmt, pattern in ((R.fmt_seconds, SECONDS), (R.fmt_clock, CLOCK)):
            text = fmt(x)
            assert re.fullmatch(pattern, text), (fmt.__name__, x, text)
            lo, hi = seconds_range(text)
            assert lo - 1e-9 <= x <= hi + 1e-9, (fmt.__name__, x, text, lo, hi)
    assert R.fmt_seconds(0.998) == "998 ms" and re.fullmatch("pool started in " + SECONDS, "pool started in 998 ms")


def test_tqdm_mini_bars_say_their_percentage_and_rate():
    ranks = infos(2)
    live = LiveLines()
    live.feed(0, "stderr", "\rtrain:  43%|####3     | 43/100 [00:03<00:04, 12.3it/s]")
    live.feed(1, "stderr", "\rtrain:  50%|#####     | 50/100 [00:03<00:03, 13.1it/s]")
    s = snap(2, ranks, lines=live.lines, bars=live.bars)
    assert R.summary(s) == "2 ranks · running 2 · 3.2 s · 43% 12.3 it/s · gloo · ✓ 2 checks passed", "the slowest bar: 43 of 100"
    header = R.header_html(s)
    assert text_of(header) == "%%ddp " + R.summary(s)
    assert "title='rank 0: train 43% 43/100 12.3 it/s; rank 1: train 50% 50/100 13.1 it/s'" in header
    assert [m for m in re.findall(r"data-rank='(\d)' data-n='(\d+)' data-total='(\d+)'", header)] == [("0", "43", "100"), ("1", "50", "100")]
    assert re.findall(r"width:(\d+)%", header) == ["43", "50"]
    ranks[0].state = ranks[1].state = RankState.DONE  # a finished rank's bar is no longer progress
    assert "it/s" not in R.summary(snap(2, ranks, lines=live.lines, bars=live.bars))


def test_the_body_opens_itself_for_a_chart_or_a_bar():
    plain = snap(2, infos(2))
    assert not R.opens_itself(plain)
    live = LiveLines()
    live.feed(1, "stderr", "\r 10%|#  | 1/10 [00:00<00:01, 9.0it/s]")
    assert R.opens_itself(snap(2, infos(2), bars=live.bars))
    section = ("Metrics", lambda s: "<svg></svg>", lambda s: [])
    assert R.opens_itself(snap(2, infos(2), sections=[section]))
    assert not R.opens_itself(snap(2, infos(2), sections=[section], finished=True, ok=True)), "a settled view stays one line"


def test_columns_no_rank_has_a_value_in_are_left_out():
    ranks = infos(2, state=RankState.DONE, finished=1002.0)
    cols = T.row_columns(T.rank_rows(snap(2, ranks)))
    assert cols == ["rank", "state", "time", "device", "pid"], "no exit, no last line: no empty column"
    ranks[1].state, ranks[1].exit_code = RankState.DEAD, 3
    ranks[0].last_line = "hi"
    assert T.row_columns(T.rank_rows(snap(2, ranks))) == ["rank", "state", "time", "device", "pid", "exit", "last line"]
    running = T.rank_rows(snap(2, infos(2)))
    assert [row.cells["time"] for row in running] == ["", ""], "a running rank's time is the header's live clock"


def test_starting_has_the_colour_of_running_as_in_the_panel():
    assert R.tone_of(RankState.STARTING) == R.tone_of(RankState.CONNECTING) == R.tone_of(RankState.RUNNING) == "info"


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


def test_memory_shows_in_the_rows_the_summary_over_32_ranks_and_the_settled_peak():
    from ddp_magic.kernel.memory import Memory

    four = infos(4, RankState.DONE)
    for i in four:
        i.mem = Memory(rss=(160 + 200 * (i.rank == 2)) << 20, peak=(170 + 200 * (i.rank == 2)) << 20)
    running, settled = snap(4, four, now=1002.0, elapsed=2.0), snap(4, four, now=1002.0, elapsed=2.0, finished=True, ok=True)
    rows = T.ranks_text(running)
    assert "memory" in rows[0] and "360.0 MiB" in rows[3] and not any(r.startswith("memory:") for r in rows)
    assert T.ranks_text(settled)[-1] == "memory: peak 370.0 MiB on rank 2"
    assert "memory: peak 370.0 MiB on rank 2" in text_of(T.ranks_html(settled))
    many = infos(64, RankState.DONE)
    for i in many:
        i.mem = Memory(rss=(100 + i.rank) << 20, cuda_allocated=1 << 30, cuda_peak=(2 << 30) + i.rank)
    line = T.memory_line(snap(64, many, now=1002.0, elapsed=2.0, finished=True, ok=True))
    assert line == "memory: RSS 100.0 MiB to 163.0 MiB; GPU peak 2.0 GiB on rank 63", line


def test_a_views_changes_are_kept_in_order_without_a_tuple_each_for_the_collector():
    """The status view's history (ui/status_labels.LabelChanges): each rank's label changes, in order, as (rank, label)."""
    from ddp_magic.ui.status_labels import LabelChanges

    changes = LabelChanges()
    for rank, label in ((0, RankState.RUNNING), (1, RankState.RUNNING), (0, RankState.DONE), (1, FailureKind.DIED)):
        changes.append(rank, label)
    assert list(changes) == [(0, "running"), (1, "running"), (0, "done"), (1, "died")] and len(changes) == 4
    assert [s for r, s in changes if r == 1] == ["running", "died"] and list(changes) == list(changes)  # read again: the same
    assert not any(isinstance(x, tuple) for x in changes._flat)  # ranks and labels side by side: no tuple a change
