"""The panel and the status bar colour a state as the cell's status view does: the same tone, written the same way.

labextension/style/base.css defines one custom property per tone (``--jp-ddp-active`` for starting and running,
``--jp-ddp-ok``, ``--jp-ddp-bad``, ``--jp-ddp-warn``, ``--jp-ddp-neutral``); each must be the very expression
ddp_magic/ui/colours.py gives the cell's view for that tone, so "starting" is not grey in the cell and blue in the
panel. The browser story (labextension/ui-tests/test_views_agree.py) compares the rendered colours as well.
"""
from __future__ import annotations

import os
import re

from ddp_magic.ui import colours

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSS = os.path.join(ROOT, "labextension", "style", "base.css")
# the panel's name of a tone -> the cell's (ui/colours.py)
TONES = {"active": "info", "ok": "ok", "bad": "fail", "warn": "warn", "neutral": "neutral"}


def _declared() -> dict:
    with open(CSS) as f:
        css = f.read()
    return dict(re.findall(r"--jp-ddp-([a-z-]+):\s*([^;]+);", css))


def test_every_panel_tone_is_the_cell_view_s() -> None:
    declared = _declared()
    for panel, cell in TONES.items():
        themed = colours.color(cell).split(";color:", 1)[1]  # "color:<plain hex>;color:<the themed mix>"
        assert declared.get(panel, "").replace(" ", "") == themed.replace(" ", ""), f"--jp-ddp-{panel} is not colours.py's {cell!r}"


def test_each_tone_is_defined_once_for_both_themes() -> None:
    """The mix toward the theme's text colour reads in light and dark alike: no second, dark-only definition to drift."""
    with open(CSS) as f:
        css = f.read()
    for panel in TONES:
        assert len(re.findall(rf"--jp-ddp-{panel}:", css)) == 1, panel
    assert "data-jp-theme-light='false'" not in css
