"""The pool's prose: start failures, missing nodes, what the other nodes run."""
from __future__ import annotations

from ddp_magic.errors import RankFailure
from ddp_magic.kernel import texts
from ddp_magic.kernel.ranks import RankInfo
from ddp_magic.states import FailureKind, RankState


def test_node_instructions_name_the_command_the_secret_and_slurm():
    text = texts.node_instructions(8, 2, 4, "torchrun --nnodes 2 x", "/home/u/.ddp_magic/secret-1")
    assert text.startswith("pool of 8 ranks on 2 nodes: this node runs 4 of them under torchrun.\nOn the other node, run ")
    assert "On each of the other 2 nodes, run " in texts.node_instructions(12, 3, 4, "x", None)
    assert "\n  torchrun --nnodes 2 x\n" in text and "/home/u/.ddp_magic/secret-1 must be readable" in text
    assert text.endswith("srun --nodes=1 --ntasks-per-node=1 torchrun --nnodes 2 x")


def test_missing_nodes_when_no_node_joined():
    ranks = {r: RankInfo(rank=r) for r in range(4)}
    text = texts.missing_nodes_text(ranks, [0, 1, 2, 3], 2, 60, "10.0.0.1:29500", "10.0.0.1:4000")
    assert text.startswith("the other node never joined the rendezvous at 10.0.0.1:29500 within 60s")
    three = texts.missing_nodes_text(ranks, [0, 1, 2, 3], 3, 60, "h:1", "h:2")
    assert three.startswith("the other 2 nodes never joined the rendezvous")
    assert "reach 10.0.0.1:29500 (rendezvous) and 10.0.0.1:4000 (control)" in text


def test_missing_nodes_names_the_nodes_that_joined():
    ranks = {r: RankInfo(rank=r, state=RankState.CONNECTING if r < 2 else RankState.STARTING, host="a", node=0) for r in range(4)}
    text = texts.missing_nodes_text(ranks, [2, 3], 2, 60, "h:1", "h:2")
    assert text.startswith("1 of 2 nodes never joined within 60s (joined: node 0 on a (ranks 0-1)); 2 ranks missing.")
    one = texts.missing_nodes_text({0: RankInfo(rank=0, state=RankState.CONNECTING, host="a", node=0), 1: RankInfo(rank=1)}, [1], 2, 60, "h:1", "h:2")
    assert "(joined: node 0 on a (rank 0)); 1 rank missing." in one


def test_start_failure_shows_the_root_its_output_the_log_and_a_taken_port():
    root = RankFailure(rank=1, kind=FailureKind.INIT, type="RuntimeError", message="EADDRINUSE", traceback="Traceback ...\n")
    root.last_lines = [str(i) for i in range(12)]
    text = texts.start_failure_text(2, [root], "  worker said hi \n", 29500)
    lines = text.splitlines()
    assert lines[0] == "the pool of 2 ranks could not start: rank 1 raised RuntimeError: EADDRINUSE"
    assert lines[1] == "Traceback ..." and lines[2] == "last lines it printed:" and lines[3] == "2"  # the last 10 lines
    assert "worker log:" in lines and "worker said hi" in lines
    assert lines[-1].startswith("MASTER_PORT 29500 was taken; run %ddp restart")
    assert "MASTER_PORT" not in texts.start_failure_text(2, [RankFailure(rank=0, kind=FailureKind.DIED, exit_code=1)], "", 1)


def test_restart_notes():
    notice = texts.restarted_notice("rank 1 exited with code 4")
    assert notice == "restarted the pool (rank 1 exited with code 4); variables defined in earlier %%ddp cells are gone"
    assert "restarts on the next cell (why)" in texts.restarts_next_note("why")
