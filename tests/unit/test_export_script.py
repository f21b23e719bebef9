"""%ddp_export's files as text: the script, its launch lines, the sbatch file; and --check's comparison."""
from __future__ import annotations

import ast
import shlex
import subprocess

import pytest

from ddp_magic.export.check import Expected, first_difference
from ddp_magic.export.record import CellRecord, DdpRun, Shipped
from ddp_magic.export.script import Launch, launch_line, sbatch_text, script_text, srun_line, with_result
from ddp_magic.export.select import select
from ddp_magic.export.write import ExportError, ExportOptions, export_files
from ddp_magic.kernel.launchers.torchrun import rendezvous_args
from ddp_magic.kernel.texts import node_instructions


def history(backend_asked: str = "auto", pg_timeout: float = 300.0, body: str = "loss = helper(3)\nprint('loss', loss)\nloss"):
    run = DdpRun(body=body, nproc=2, backend="gloo", backend_asked=backend_asked, pg_timeout=pg_timeout,
                 shipped=(Shipped("helper", "function", 100),), values=("7", "7"), stdout=(("loss 7",), ("loss 7",)))
    return [CellRecord(1, "def helper(x):\n    return 2 * x + 1"), CellRecord(2, "%%ddp -n 2\n" + body, True, (run,))]


def test_script_compiles_and_sets_up_the_process_group_as_the_pool_did():
    text = script_text(select(history("gloo", 60.0)), "train.py", Launch(2))
    tree = ast.parse(text)
    assert ast.get_docstring(tree).splitlines()[3].strip() == "torchrun --standalone --nproc-per-node 2 train.py"
    assert "backend = 'gloo'" in text and "timedelta(seconds=60.0)" in text
    assert 'torch.cuda.set_device(local_rank)' in text and 'kwargs["device_id"] = torch.device("cuda", local_rank)' in text
    assert text.index("_ddp_init_process_group()\n") < text.index("def helper") < text.index("loss = helper(3)")
    assert "_ddp_result = (loss)" in text and text.rstrip().endswith("_ddp_finish(globals())")
    assert "# In [1]: defines what the %%ddp cells use" in text and "# In [2]: %%ddp cell (every rank runs it)" in text


def test_auto_backend_is_decided_on_the_machine_that_runs_the_script():
    text = script_text(select(history("auto")), "train.py", Launch(2))
    assert 'backend = "nccl" if torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1")) else "gloo"' in text


def test_cells_that_initialise_the_group_themselves_keep_theirs():
    body = "import torch.distributed as dist\nif not dist.is_initialized():\n    dist.init_process_group('gloo')\n1"
    text = script_text(select(history(body=body)), "t.py", Launch(2))
    assert "\n_ddp_init_process_group()\n" not in text and "initialise the process group themselves" in text


@pytest.mark.parametrize("code,expected", [
    ("x = 1\nx + 1", "x = 1\n_ddp_result = (x + 1)"),
    ("x = 1\nx;", "x = 1\n_ddp_result = (x)"),
    ("a = 1; a", "a = 1; _ddp_result = (a)"),
    ("(1,\n 2)", "_ddp_result = ((1,\n 2))"),
    ("x = 1", "x = 1\n_ddp_result = None"),
])
def test_with_result_keeps_the_last_expression(code, expected):
    assert with_result(code) == expected
    compile(with_result(code), "<t>", "exec")


def test_launch_lines():
    assert launch_line("train.py", Launch(4)) == "torchrun --standalone --nproc-per-node 4 train.py"
    assert launch_line("my train.py", Launch(2, accelerate=True, backend="auto")) == "accelerate launch --multi_gpu --num_processes 2 'my train.py'"
    assert launch_line("t.py", Launch(2, accelerate=True, backend="gloo")) == "accelerate launch --num_processes 2 t.py"


def test_sbatch_is_valid_bash_and_its_srun_line_is_the_pools_multinode_command(tmp_path):
    launch = Launch(nproc=8, nodes=2, gpus_per_node=4, backend="auto")
    path = tmp_path / "train.sbatch"
    path.write_text(sbatch_text("train.py", launch, "train.sbatch"))
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    text = path.read_text()
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --gpus-per-node=4\n" in text and "#SBATCH --ntasks-per-node=1\n" in text
    ours = shlex.split(next(ln for ln in text.splitlines() if ln.startswith("srun ")))
    pool_cmd = " ".join(["torchrun", *rendezvous_args(2, 4, "10.0.0.1:29400", "run1"), "-m", "ddp_magic.procs.worker"])
    slurm = node_instructions(8, 2, 4, pool_cmd, "/s").split("Under Slurm: ", 1)[1]
    theirs = shlex.split(slurm)
    assert _flags(ours) == _flags(theirs)
    for flag in ("--nnodes", "--nproc-per-node", "--rdzv-backend", "--max-restarts", "--ntasks-per-node=1"):
        assert _value(ours, flag) == _value(theirs, flag)
    assert "--nodes=2" in ours and ours[-1] == "train.py"


def _flags(args):
    return [a.split("=")[0] for a in args[: args.index("torchrun") + 15] if a.startswith("--")]


def _value(args, flag):
    return args[args.index(flag) + 1] if flag in args else flag in args


def test_sbatch_with_accelerate_expands_the_node_rank_on_each_node(tmp_path):
    text = srun_line("train.py", Launch(nproc=4, nodes=2, accelerate=True, backend="auto"))
    assert text.startswith("srun --nodes=2 --ntasks-per-node=1 bash -c 'accelerate launch --num_machines 2 --num_processes 4")
    assert "--machine_rank $SLURM_NODEID" in text


def test_export_files_writes_the_script_and_says_how_to_run_it(tmp_path):
    out = export_files(history(), ExportOptions(path=str(tmp_path / "train"), slurm=True, nodes=2))
    assert out.script.endswith("train.py") and out.sbatch is not None and out.sbatch.endswith("train.sbatch")
    assert out.text().splitlines()[1] == f"  torchrun --standalone --nproc-per-node 2 {out.script}"
    assert out.launch.nodes == 2 and out.launch.per_node == 1
    eight = export_files(history(), ExportOptions(path=str(tmp_path / "t8.py"), slurm=True, nodes=2, gpus_per_node=4))
    assert "--nproc-per-node 2 " in eight.text(), "the one-node line keeps the pool's ranks"
    assert "(2 nodes x 4 ranks)" in eight.text() and "--nproc-per-node 4 " in open(eight.sbatch or "").read()
    assert out.expected.lines == (("loss 7",), ("loss 7",)) and out.expected.values == ("7", "7")
    compile(open(out.script).read(), out.script, "exec")


def test_export_errors_say_what_to_do(tmp_path):
    with pytest.raises(ExportError, match="no %%ddp cell ran successfully"):
        export_files([CellRecord(1, "x = 1")], ExportOptions(path=str(tmp_path / "t.py")))
    with pytest.raises(ExportError, match="--cells"):
        export_files(history(), ExportOptions(path=str(tmp_path / "t.py"), cells="x"))
    with pytest.raises(ExportError, match="split evenly"):
        export_files(history(), ExportOptions(path=str(tmp_path / "t.py"), nproc=3, nodes=2, slurm=True))
    with pytest.raises(ExportError, match="add --slurm"):
        export_files(history(), ExportOptions(path=str(tmp_path / "t.py"), nodes=2))


EXPECTED = Expected(lines=(("epoch 0", "loss 0.5"), ("epoch 0", "loss 0.5")), values=("0.5", "0.5"), final_cell=4)


def test_first_difference_names_the_rank_and_the_line():
    assert first_difference(EXPECTED, [["x", "epoch 0", "loss 0.5"], ["epoch 0", "loss 0.5"]], ["0.5", "0.5"]) is None
    diff = first_difference(EXPECTED, [["epoch 0", "loss 0.5"], ["epoch 0", "loss 0.7"]], ["0.5", "0.5"])
    assert diff == "rank 1, line 2 of the last 2 printed: the cells printed 'loss 0.5', the script printed 'loss 0.7'"
    diff = first_difference(EXPECTED, [["epoch 0", "loss 0.5"], ["epoch 0", "loss 0.5"]], ["0.5", "0.6"])
    assert diff == "rank 1, the final cell's value (In [4]): the cells returned '0.5', the script '0.6'"
    assert "the script only 1" in (first_difference(EXPECTED, [["loss 0.5"], []], [None, None]) or "")


def test_the_magic_help_is_generated_from_its_parser_and_bad_input_is_short(tmp_path, capsys):
    from types import SimpleNamespace

    from ddp_magic.errors import UsageError
    from ddp_magic.magics import DDPMagics

    m = DDPMagics(None)
    m.shell = SimpleNamespace(user_ns={})  # type: ignore[assignment]
    doc = m.ddp_export.__doc__
    for option in ("--cells", "--n", "--slurm", "--nodes", "--gpus-per-node", "--accelerate", "--check"):
        assert option in doc
    assert "%ddp_export train.py --check" in doc
    with pytest.raises(UsageError, match="%ddp_export: .*--bogus"):
        m.ddp_export("--bogus")
    with pytest.raises(ExportError, match="no %%ddp cell ran successfully"):
        m.ddp_export(str(tmp_path / "t.py"))
    m.session.history.cells.extend(history())
    m.ddp_export(f"{tmp_path}/t.py --cells 2")
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {tmp_path}/t.py: cells 1, 2 (1 %%ddp). Run it with:")
