"""The status view's colours: one tone per meaning, readable (WCAG AA) in light and dark themes, untrusted or not.

Each tone is written as two declarations in an inline ``style``: a plain hex
colour first, which JupyterLab's sanitizer keeps in an untrusted notebook (it
accepts only hex, rgb and names), then a ``color-mix`` of JupyterLab's theme
variable with the theme's own text colour (black in light themes, white in
dark ones), which trusted outputs use: mixing toward the text colour is what
keeps 4.5:1 against both backgrounds, which no single theme variable does.
Outside JupyterLab the variables' fallbacks are the light theme's values.
tests/unit/test_colours.py computes every pair's contrast from these tables.
"""
from __future__ import annotations

from typing import Dict, Tuple

# tone -> (JupyterLab variable, its light-theme value as fallback, plain hex for sanitized outputs, share of the tone in the mix)
TONES: Dict[str, Tuple[str, str, str, float]] = {
    "ok": ("--jp-success-color1", "#388e3c", "#1a7f37", 0.75),
    "fail": ("--jp-error-color1", "#d32f2f", "#cf222e", 0.75),
    "warn": ("--jp-warn-color1", "#f57c00", "#9a6700", 0.70),
    "info": ("--jp-brand-color1", "#1976d2", "#0969da", 0.75),
}
# neutral (stopped by us): the theme's text colour faded toward its background; starting is "info", as running
NEUTRAL = ("--jp-content-font-color0", "#000000", "--jp-layout-color0", "#ffffff", "#57606a", 0.62)
TEXT_VAR = ("--jp-content-font-color0", "#000000")

# JupyterLab 4's own values of the variables above, per theme (the contrast test resolves the mixes with them)
PALETTES: Dict[str, Dict[str, str]] = {
    "light": {"--jp-success-color1": "#388e3c", "--jp-error-color1": "#d32f2f", "--jp-warn-color1": "#f57c00", "--jp-brand-color1": "#1976d2",
              "--jp-content-font-color0": "#000000", "--jp-layout-color0": "#ffffff"},
    "dark": {"--jp-success-color1": "#4caf50", "--jp-error-color1": "#f44336", "--jp-warn-color1": "#ff9800", "--jp-brand-color1": "#2196f3",
             "--jp-content-font-color0": "#ffffff", "--jp-layout-color0": "#111111"},
    "fallback": {},  # no JupyterLab variables (nbviewer, GitHub, VS Code): every var() takes its fallback
}
BACKGROUNDS = {"light": ("#ffffff",), "dark": ("#111111", "#212121"), "fallback": ("#ffffff",), "sanitized": ("#ffffff",)}


def _mix_css(tone: str) -> Tuple[str, str]:
    """(plain hex, the themed color-mix expression) of a tone."""
    if tone == "neutral":
        var, fb, bg_var, bg_fb, plain, share = NEUTRAL
        return plain, f"color-mix(in srgb,var({var},{fb}) {share * 100:.0f}%,var({bg_var},{bg_fb}))"
    var, fb, plain, share = TONES[tone]
    return plain, f"color-mix(in srgb,var({var},{fb}) {share * 100:.0f}%,var({TEXT_VAR[0]},{TEXT_VAR[1]}))"


def color(tone: str) -> str:
    """``color:`` declarations for text of this tone (inline style)."""
    plain, themed = _mix_css(tone)
    return f"color:{plain};color:{themed}"


def background(tone: str) -> str:
    """``background:`` declarations for a swatch of this tone (a rank square, a progress bar)."""
    plain, themed = _mix_css(tone)
    return f"background:{plain};background:{themed}"


def defs() -> str:
    """Custom properties holding every tone's themed colour: put once on a fragment's root, so that its many
    per-rank items refer to them in a few bytes (``color_ref``, ``background_ref``)."""
    return "".join(f"--ddp-{tone}:{_mix_css(tone)[1]};" for tone in (*TONES, "neutral"))


def color_ref(tone: str) -> str:
    """Short ``color:`` declarations for an item inside a fragment whose root has ``defs()``."""
    return f"color:{_mix_css(tone)[0]};color:var(--ddp-{tone})"


def background_ref(tone: str) -> str:
    return f"background:{_mix_css(tone)[0]};background:var(--ddp-{tone})"


# ---------------------------------------------------------------- what a browser would compute (for the contrast test)
def _rgb(hexa: str) -> Tuple[float, float, float]:
    h = hexa.lstrip("#")
    return (int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16))


def resolve(tone: str, palette: str) -> str:
    """The hex colour a tone's text gets in a palette ('light', 'dark', 'fallback'; 'sanitized': the plain hex)."""
    if tone == "neutral":
        var, fb, bg_var, bg_fb, plain, share = NEUTRAL
        a, b = (var, fb), (bg_var, bg_fb)
    else:
        var, fb, plain, share = TONES[tone]
        a, b = (var, fb), TEXT_VAR
    if palette == "sanitized":
        return plain
    values = PALETTES[palette]
    ca, cb = _rgb(values.get(a[0], a[1])), _rgb(values.get(b[0], b[1]))
    return "#" + "".join(f"{round(x * share + y * (1 - share)):02x}" for x, y in zip(ca, cb))


def luminance(hexa: str) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in _rgb(hexa))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: str, bg: str) -> float:
    """WCAG 2 contrast ratio of two hex colours."""
    hi, lo = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


# ---------------------------------------------------------------- [rank N] prefixes in the streams: ANSI, so every front end shows them
RANK_ANSI = ("34", "35", "36", "32", "1;34", "1;35", "1;36", "1;32")  # blue, magenta, cyan, green, then bold; never red: red means errors


def rank_ansi(rank: int) -> str:
    """The SGR code of a rank's prefix colour."""
    return RANK_ANSI[rank % len(RANK_ANSI)]
