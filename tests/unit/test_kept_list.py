"""A kept pool said in short facts, each once: ``%ddp attach --list``'s lines and the DDP panel's row.

Before: one line per pool that named the notebook by its absolute path and, attached or not, the kernel twice
(``no kernel attached  kept: no kernel attached since …``), and ``ends … unless … a job runs`` while a job ran; a
notebook's output area wrapped it anywhere, in the middle of a time. Now: the file name, ``no kernel since 04:28``
once, the lease as it stands (a running job: ``ends at most at …``), lines short enough not to wrap."""
from __future__ import annotations

import time

from ddp_magic.kernel.keep.attach import Found, list_text
from ddp_magic.ui.kept_list import panel_rows

NOW = time.time()


def found(**over: object) -> Found:
    data = {"id": "3fa9c2e1", "notebook": "/home/someone/projects/deep/train.ipynb", "nproc": 2, "job": "cell [2]",
            "busy": [0, 1], "idle": 1800.0, "max": 86400.0, "since": NOW - 60, "left_at": NOW - 30, "attached": None}
    data.update(over)
    return Found("/tmp/ddp-kept-3fa9c2e1.json", data, True)


def test_a_running_detached_pool_says_each_fact_once() -> None:
    f = found()
    fields = f.fields()
    assert fields["notebook"] == "train.ipynb" and fields["ranks"] == "2 ranks"
    assert fields["job"] == "cell [2] running on ranks 0-1"
    assert fields["kernel"].startswith("no kernel since ") and fields["lease"].startswith("ends at most at ")
    text = list_text([f])
    assert "/home/someone" not in text and text.count("train.ipynb") == 1, text
    assert text.count("no kernel") == 1 and "unless" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text  # an output area wraps a longer one anywhere


def test_an_idle_pool_ends_unless_a_kernel_attaches_and_an_attached_one_names_its_kernel() -> None:
    idle = found(busy=[]).fields()
    assert idle["job"] == "idle" and "unless a kernel attaches" in idle["lease"]
    on = found(attached={"kernel": "/home/someone/projects/deep/train.ipynb", "pid": 4242, "since": NOW}).fields()
    assert on["kernel"].startswith("attached to pid 4242 since ") and "after its kernel leaves" in on["lease"]
    assert "/home" not in list_text([found(attached={"kernel": "/a/b.ipynb", "pid": 1, "since": NOW})])


def test_an_ended_pool_says_why_in_one_line() -> None:
    ended = found(state="ended", why="its lease's --max (8.00 s) ran out")
    assert ended.line() == "3fa9c2e1  train.ipynb  2 ranks  ended: its lease's --max (8.00 s) ran out"


def test_the_panels_question_answers_json_without_the_magic(monkeypatch, tmp_path) -> None:
    """What kept_probe.ts reads: ``application/json`` of the user expression, [] where nothing is kept."""
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "none.ipynb"))
    assert panel_rows()._repr_json_() == []
