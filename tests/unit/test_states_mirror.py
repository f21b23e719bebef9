"""The JupyterLab extension names rank states and failure kinds as ddp_magic.states does, in the same order.

labextension/src/model.ts holds them as ``export const RANK_STATES = [...] as const`` and
``FAILURE_KINDS``; the kernel sends the enums' values in its snapshots, so a name added or
renamed on one side only would show up as an unknown state in the lab UI.
"""
from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import List, Type

import pytest

from ddp_magic.states import FailureKind, RankState

MODEL_TS = Path(__file__).resolve().parents[2] / "labextension" / "src" / "model.ts"


def ts_const_list(name: str) -> List[str]:
    """The string literals of ``export const NAME = [...] as const;`` in model.ts."""
    source = MODEL_TS.read_text()
    found = re.search(rf"export const {name}\s*=\s*\[(.*?)\]\s*as const;", source, re.S)
    assert found, f"{MODEL_TS}: no `export const {name} = [...] as const;` (the mirror of ddp_magic/states.py)"
    body = re.sub(r"//[^\n]*", "", found.group(1))
    items = [item.strip() for item in body.split(",") if item.strip()]
    for item in items:
        assert re.fullmatch(r"'[a-z_]+'", item), f"{name}: {item!r} is not a plain quoted name"
    return [item.strip("'") for item in items]


@pytest.mark.parametrize("name, enum", [("RANK_STATES", RankState), ("FAILURE_KINDS", FailureKind)])
def test_model_ts_mirrors_the_python_enum(name: str, enum: Type[Enum]) -> None:
    assert ts_const_list(name) == [member.value for member in enum], (
        f"labextension/src/model.ts {name} must list ddp_magic.states.{enum.__name__}'s values in order"
    )


def test_the_rank_snapshot_uses_the_state_type() -> None:
    source = MODEL_TS.read_text()
    snapshot = re.search(r"export interface IRankSnapshot \{(.*?)\n\}", source, re.S)
    assert snapshot and re.search(r"^\s*state: RankState;", snapshot.group(1), re.M)
