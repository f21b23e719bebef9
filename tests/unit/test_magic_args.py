"""The magics' arguments and help, without a kernel or a worker: the parsers, the generated help, the short usage errors."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict

import pytest

from ddp_magic import logs
from ddp_magic.errors import ShipError, UsageError
from ddp_magic.magics import SEE_HELP, DDPMagics, _ddp_line, _parse, _pool_request


@pytest.fixture
def magics() -> DDPMagics:
    """The magics on a stand-in shell: enough for everything that happens before a pool exists."""
    m = DDPMagics(None)
    m.shell = SimpleNamespace(user_ns={})  # type: ignore[assignment]
    return m


def _options(parser: Any) -> set:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def test_help_is_generated_from_the_parsers_and_shows_examples(magics: DDPMagics) -> None:
    text = magics.ddp.__doc__
    for option in _options(magics.ddp.parser) | _options(_ddp_line.parser):
        assert option in text, option
    assert "%%ddp [-n N]" in text and "%ddp [-n N]" in text
    assert "%%ddp -n 4 " in text and "%ddp restart [-n N]" in text, "the examples"
    assert "%ddp log" in text and "DDP_MAGIC_LOG=debug" in text
    assert "--json" in magics.ddp_env.__doc__ and "%ddp_env -n 4" in magics.ddp_env.__doc__


def test_every_option_says_what_it_does(magics: DDPMagics) -> None:
    for parser in (magics.ddp.parser, _ddp_line.parser, magics.ddp_env.parser):
        for action in parser._actions:
            assert action.help, f"{parser.prog} {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize(
    "line, needle",
    [
        ("-n 0", "1 or more"),
        ("-n -3", "1 or more"),
        ("-n two", "not a whole number"),
        ("--bogus", "unrecognized arguments: --bogus"),
        ("--backend carrier-pigeon", "invalid choice"),
        ("--master-port http", "not a port number"),
    ],
)
def test_a_bad_flag_is_one_short_line_and_a_pointer_to_the_help(magics: DDPMagics, line: str, needle: str) -> None:
    with pytest.raises(UsageError) as err:
        magics.ddp(line, "1")
    first, second = str(err.value).splitlines()
    assert first.startswith("%%ddp: ") and needle in first
    assert second == SEE_HELP
    assert magics.session.pool is None


@pytest.mark.parametrize("line", ["attach 3fa9 --out job", "attach --out job 3fa9", "attach --force --out job 3fa9", "--out job attach 3fa9"])
def test_attach_takes_its_pool_id_before_or_after_the_options(line: str) -> None:
    """The panel's Attach and a user's `%ddp attach --force 3fa9` alike (plain argparse refused an id after an option)."""
    args = _parse(_ddp_line, line, "%ddp")
    assert (args.action, args.target, args.out) == ("attach", "3fa9", "job"), args
    with pytest.raises(UsageError, match="unrecognized arguments: 4b2c"):
        _parse(_ddp_line, line + " 4b2c", "%ddp")  # one id at most, still refused in one short line


def test_an_unclosed_quote_is_a_usage_error(magics: DDPMagics) -> None:
    with pytest.raises(UsageError, match="cannot read the arguments"):
        magics.ddp("--argv 'a", "1")


@pytest.mark.parametrize("call", [lambda m: m.ddp("-h", "1"), lambda m: m.ddp("--help"), lambda m: m.ddp_env("-h")])
def test_dash_h_prints_the_help(magics: DDPMagics, call: Any, capsys: Any) -> None:
    assert call(magics) is None
    assert "show this help" in capsys.readouterr().out


def test_pool_options_become_spec_names() -> None:
    args = _ddp_line.parser.parse_argstring("restart -n 2 --join-timeout 5 --no-init --nccl-debug INFO --master-port 29600")
    request: Dict[str, Any] = _pool_request(args)
    assert request == {"nproc": 2, "start_timeout": 5.0, "init": False, "master_port": 29600, "extra_env": {"NCCL_DEBUG": "INFO"}}
    assert _pool_request(_ddp_line.parser.parse_argstring("status")) == {}


def test_line_actions_without_a_pool(magics: DDPMagics, capsys: Any) -> None:
    magics.ddp("status")
    assert "no pool is running; start one with %%ddp -n N" in capsys.readouterr().out
    magics.ddp("stop")
    assert capsys.readouterr().out.strip() == "no pool is running"
    with pytest.raises(UsageError, match="no pool to restart"):
        magics.ddp("restart")
    with pytest.raises(UsageError, match="pool options need an action"):
        magics.ddp("status -n 2")
    with pytest.raises(UsageError, match="no pool is running: give the number of ranks to plan for"):
        magics.ddp_env("")


def test_ddp_log_shows_the_recent_records(magics: DDPMagics, capsys: Any) -> None:
    logs.log.debug("a marker for the bug report")
    magics.ddp("log")
    out = capsys.readouterr().out
    assert out.startswith("ddp_magic log:") and "DDP_MAGIC_LOG=debug" in out
    assert "a marker for the bug report" in out


def test_a_cell_without_n_and_without_a_pool_says_what_to_give(magics: DDPMagics) -> None:
    with pytest.raises(UsageError, match="give the number of ranks on the first cell"):
        magics.ddp("", "1")


def test_a_syntax_error_or_an_unpicklable_name_starts_nothing(magics: DDPMagics) -> None:
    with pytest.raises(UsageError, match="SyntaxError in the cell"):
        magics.ddp("-n 2", "if True print('x')")
    import threading

    magics.shell.user_ns["my_lock"] = threading.Lock()
    with pytest.raises(ShipError, match="'my_lock'"):
        magics.ddp("-n 2", "print(my_lock)")
    assert magics.session.pool is None


def test_save_on_preempt_asks_slurm_for_its_warning(magics: DDPMagics) -> None:
    """--save-on-preempt with --slurm: salloc gets --signal=USR1@120 after the user's own --slurm-args (docs/snapshots.md)."""
    args = _parse(magics.ddp, '--slurm --nodes 2 --slurm-args "--qos=high" --save-on-preempt ckpt/', "%%ddp")
    assert _pool_request(args)["slurm"]["extra"] == ("--qos=high", "--signal=USR1@120")
    assert "extra" not in _pool_request(_parse(magics.ddp, "--slurm --nodes 2", "%%ddp"))["slurm"]
    assert _pool_request(_parse(magics.ddp, "--save-on-preempt ckpt/", "%%ddp")) == {}, "a local pool: nothing to ask"
