"""The status view's colours (ddp_magic.ui.colours): WCAG AA contrast in every palette the view meets.

Every text colour the view uses is one of colours.py's tones; each is computed the way the browser would
(the color-mix of JupyterLab's theme values, or the variables' fallbacks, or the plain hex an untrusted
notebook keeps) and checked against the backgrounds of that palette.
"""
from __future__ import annotations

import re

import pytest

from ddp_magic.states import FailureKind, RankState
from ddp_magic.ui import colours
from ddp_magic.ui import status_render as R

TEXT_TONES = sorted(set(R.STATE_TONES.values()) | {"ok", "fail", "warn"})


@pytest.mark.parametrize("palette", ["light", "dark", "fallback", "sanitized"])
@pytest.mark.parametrize("tone", TEXT_TONES)
def test_every_text_colour_meets_wcag_aa(tone, palette):
    fg = colours.resolve(tone, palette)
    for bg in colours.BACKGROUNDS[palette]:
        ratio = colours.contrast(fg, bg)
        assert ratio >= 4.5, f"{tone} text {fg} on {bg} in the {palette} palette: {ratio:.2f}:1"


def test_the_palettes_are_jupyterlabs():
    """The dark and light values are JupyterLab 4's own (theme-*-extension/index.css), where the labextension's build has them."""
    assert colours.PALETTES["dark"]["--jp-layout-color0"] == "#111111" and colours.PALETTES["light"]["--jp-error-color1"] == "#d32f2f"


def test_killed_and_failed_are_not_two_reds():
    killed, failed = (colours.resolve(R.STATE_TONES[label], "light") for label in (FailureKind.KILLED, RankState.FAILED))
    assert killed != failed
    assert R.STATE_TONES[RankState.STOPPED] == "neutral"


def test_the_css_keeps_a_plain_colour_for_sanitizers():
    """JupyterLab's sanitizer (untrusted notebooks) accepts only hex/rgb/named colours: the plain one comes first."""
    for tone in TEXT_TONES:
        decls = colours.color(tone).split(";")
        assert re.fullmatch(r"color:#[0-9a-f]{6}", decls[0]) and decls[1].startswith("color:color-mix(")
        assert re.fullmatch(r"color:#[0-9a-f]{6}", colours.color_ref(tone).split(";")[0])
    assert "--ddp-fail:color-mix(" in colours.defs()


def test_contrast_arithmetic():
    assert round(colours.contrast("#000000", "#ffffff"), 1) == 21.0
    assert colours.contrast("#777777", "#777777") == 1.0
