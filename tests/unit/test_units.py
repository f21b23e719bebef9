"""Unit tests of the plain-Python pieces: no kernel, no worker processes."""
from __future__ import annotations

import io
import os
import pickle
import socket
import threading

import pytest

from ddp_magic.wire import namespace
from ddp_magic.wire import protocol as P
from ddp_magic.wire import transfer
from ddp_magic.wire.capture import SYNC_END, SYNC_PREFIX, MarkerScanner
from ddp_magic.plan.plan import PlanError, choose_backend, GPUInfo, make_plan
from ddp_magic.errors import CellError, RankFailure, describe_exit
from ddp_magic.wire.execution import format_user_traceback, run_source, syntax_error_text
from ddp_magic.ui.output import RankPrinter, parse_ranks


# ---------------------------------------------------------------- output
def _printer(**kw):
    out, err = io.StringIO(), io.StringIO()
    return RankPrinter(streams={"stdout": lambda: out, "stderr": lambda: err}, **kw), out, err


def test_lines_are_prefixed_and_partials_wait_for_their_end():
    p, out, _ = _printer()
    p.feed(0, "stdout", "hel")
    p.feed(1, "stdout", "world\n")
    p.feed(0, "stdout", "lo\nnext")
    assert out.getvalue() == "[rank 1] world\n[rank 0] hello\n"
    p.flush()
    assert out.getvalue().endswith("[rank 0] next\n")


def test_carriage_return_progress_redraws_in_place():
    p, out, _ = _printer()
    for i in range(3):
        p.feed(0, "stdout", f"\r{i}/3")
    p.feed(0, "stdout", "\r3/3\n")
    text = out.getvalue()
    assert "[rank 0] 0/3\r" in text and "[rank 0] 3/3\n" in text
    assert "[rank 0] \r" not in text  # no empty prefixed redraws


def test_other_rank_does_not_overwrite_an_open_progress_line():
    p, out, _ = _printer()
    p.feed(0, "stdout", "\r50%\r")
    p.feed(1, "stdout", "log line\n")
    assert out.getvalue() == "[rank 0] 50%\r\n[rank 1] log line\n"


def test_rank_filter_and_ordered_mode():
    p, out, _ = _printer(ranks={1})
    p.feed(0, "stdout", "zero\n")
    p.feed(1, "stdout", "one\n")
    assert out.getvalue() == "[rank 1] one\n"
    p, out, _ = _printer(ordered=True)
    p.feed(1, "stdout", "b\n")
    p.feed(0, "stdout", "a\n")
    assert out.getvalue() == ""
    p.flush()
    assert out.getvalue() == "[rank 0] a\n[rank 1] b\n"


def test_endless_line_is_cut_not_held():
    p, out, _ = _printer()
    p.feed(0, "stdout", "x" * 200_000)
    assert len(out.getvalue()) > 100_000


@pytest.mark.parametrize("spec, want", [("0", {0}), ("0,2", {0, 2}), ("1-3", {1, 2, 3}), ("0, 2-3", {0, 2, 3})])
def test_parse_ranks(spec, want):
    assert parse_ranks(spec) == want


@pytest.mark.parametrize("spec", ["a", "3-1", "-1"])
def test_parse_ranks_rejects(spec):
    with pytest.raises(ValueError):
        parse_ranks(spec)


# ---------------------------------------------------------------- capture markers
def test_marker_scanner_handles_markers_cut_anywhere():
    stream = b"abc" + SYNC_PREFIX + b"12" + SYNC_END + b"def" + SYNC_PREFIX + b"13" + SYNC_END
    for cut in range(1, len(stream)):
        sc = MarkerScanner()
        t1, k1 = sc.feed(stream[:cut])
        t2, k2 = sc.feed(stream[cut:])
        assert t1 + t2 == b"abcdef" and k1 + k2 == [12, 13], cut


# ---------------------------------------------------------------- protocol
def test_frames_round_trip_in_pieces():
    frames = P.encode({"op": "x", "n": 1}) + P.encode({"op": "y", "data": b"z" * 1000})
    r = P.FrameReader()
    got = []
    for i in range(0, len(frames), 7):
        got += r.feed(frames[i : i + 7])
    assert got == [{"op": "x", "n": 1}, {"op": "y", "data": b"z" * 1000}]


def test_handshake_accepts_the_right_secret():
    a, b = socket.socketpair()
    secret = P.new_secret()
    t = threading.Thread(target=P.server_handshake, args=(a, secret))
    t.start()
    P.client_handshake(b, secret)
    t.join()
    a.close()
    b.close()


# ---------------------------------------------------------------- namespace
def test_used_and_assigned_globals():
    src = "import numpy as np\nfrom os import path\ndef f(a):\n    return helper(a) + k\nclass C: pass\nx = f(y)\nfor i in range(n): pass\n"
    used = namespace.used_globals(src, "<c>")
    assert {"helper", "k", "y", "n", "f", "range"} <= used
    assert namespace.assigned_globals(src, "<c>") >= {"np", "path", "f", "C", "x", "i"}


def test_global_declared_in_function_counts_as_assigned():
    assert "total" in namespace.assigned_globals("def g():\n    global total\n    total = 1\n", "<c>")


def test_names_to_ship_follows_ownership():
    ns = {"helper": len, "k": 3, "model": object(), "In": [], "print": print}
    ship = namespace.names_to_ship("helper(model) + k\nprint(In)", "<c>", ns, worker_owned={"model"})
    assert ship == {"helper": len, "k": 3}


# ---------------------------------------------------------------- transfer
def test_tensors_travel_out_of_band_inline_and_through_shm():
    torch = pytest.importorskip("torch")
    small = {"t": torch.arange(6, dtype=torch.float16).reshape(2, 3), "s": "text"}
    packed = transfer.pack(small)
    assert "buffers" in packed
    got = transfer.unpack(packed)
    assert torch.equal(got["t"], small["t"]) and got["s"] == "text"
    big = [torch.ones(1 << 19), torch.zeros(3, dtype=torch.bool), torch.tensor(7.5, dtype=torch.bfloat16)]
    packed = transfer.pack(big)
    assert "shm" in packed and os.path.exists(packed["shm"])
    got = transfer.unpack(packed)
    assert not os.path.exists(packed["shm"])  # unlinked as soon as mapped
    assert torch.equal(got[0], big[0]) and torch.equal(got[1], big[1]) and got[2].item() == 7.5
    got[0] += 1  # writable, private to the kernel
    assert got[0][0].item() == 2.0


def test_noncontiguous_cuda_free_views_and_parameters():
    torch = pytest.importorskip("torch")
    base = torch.arange(12.0).reshape(3, 4)
    p = torch.nn.Parameter(torch.ones(2))
    got = transfer.unpack(transfer.pack([base.t(), p, torch.empty(0, 5)]))
    assert torch.equal(got[0], base.t()) and torch.equal(got[1], p.detach()) and got[2].shape == (0, 5)


def test_unpack_refuses_paths_outside_shm():
    with pytest.raises(ValueError):
        transfer.unpack({"pickle": pickle.dumps(1), "shm": "/etc/passwd", "sizes": [1]})


def test_dumps_names_names_the_culprit():
    blobs, failure = transfer.dumps_names({"ok": 1, "bad": threading.Lock()})
    assert failure is not None and failure[0] == "bad" and "lock" in failure[1]


# ---------------------------------------------------------------- execution
def test_last_expression_value_and_traceback_points_at_cell():
    ns: dict = {}
    assert run_source("a = 2\na * 21", "<ddp-cell-t>", ns) == 42
    with pytest.raises(ZeroDivisionError) as info:
        run_source("x = 1\n1 / 0", "<ddp-cell-u>", ns)
    text = format_user_traceback(info.value, "<ddp-cell-u>")
    assert 'File "<ddp-cell-u>", line 2' in text and "1 / 0" in text and "execution.py" not in text


def test_syntax_error_text_is_short_with_a_caret():
    try:
        compile("x = (\n", "<c>", "exec")
    except SyntaxError as e:
        text = syntax_error_text(e)
    assert "line 1" in text and "^" in text


# ---------------------------------------------------------------- env plan and errors
def test_plan_envs_are_complete_and_distinct():
    plan = make_plan(3, gpus=GPUInfo(count=0, cuda_built=False), environ={})
    envs = plan.all_envs()
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["MASTER_PORT"] for e in envs} == {str(plan.master_port)}
    assert all(e["WORLD_SIZE"] == "3" and e["LOCAL_WORLD_SIZE"] == "3" and e["NODE_RANK"] == "0" for e in envs)
    assert envs[0]["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 3))


def test_kernel_omp_setting_is_respected():
    plan = make_plan(2, gpus=GPUInfo(count=0, cuda_built=False), environ={"OMP_NUM_THREADS": "7"})
    assert "OMP_NUM_THREADS" not in plan.rank_env(0)


@pytest.mark.parametrize(
    "requested, n, gpus, want",
    [("auto", 2, 2, "nccl"), ("auto", 4, 2, "gloo"), ("auto", 2, 0, "gloo"), ("gloo", 2, 2, "gloo"), ("nccl", 2, 4, "nccl")],
)
def test_backend_choice(requested, n, gpus, want):
    assert choose_backend(requested, n, GPUInfo(count=gpus, cuda_built=True))[0] == want


def test_nccl_needs_a_gpu_per_rank():
    with pytest.raises(PlanError, match="one rank per GPU"):
        choose_backend("nccl", 4, GPUInfo(count=2, cuda_built=True))


def test_describe_exit():
    assert describe_exit(3) == "exited with code 3"
    assert "SIGSEGV" in describe_exit(-11) and "SIGKILL" in describe_exit(-9)


def test_cell_error_renders_root_cause_first_and_groups_the_same():
    err = CellError(
        [
            RankFailure(rank=1, kind="error", type="ValueError", message="bad", traceback="Traceback...\nValueError: bad"),
            RankFailure(rank=2, kind="error", type="ValueError", message="bad"),
            RankFailure(rank=3, kind="error", type="ValueError", message="bad"),
        ]
    )
    text = str(err)
    assert text.startswith("rank 1 raised ValueError: bad") and "ranks 2, 3 failed the same way" in text
    assert err.ranks == [1, 2, 3]
    assert err._render_traceback_()[0].startswith("CellError: rank 1")


def test_results_from_another_host_travel_inline():
    torch = pytest.importorskip("torch")
    packed = transfer.pack(torch.ones(1 << 20), shm_dir=None)  # what a rank on another node does
    assert "shm" not in packed and torch.equal(transfer.unpack(packed), torch.ones(1 << 20))
