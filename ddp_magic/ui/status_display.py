"""How the status view reaches the page: one small strategy per front end, chosen once.

``status.choose_mode`` names the mode, ``make_display`` turns it into one of:

- ``WidgetDisplay``: stock ipywidgets updated live over the comm (a kernel with
  ipywidgets). A cell that ends within ``live_after`` seconds never builds them:
  its static summary is shown at the start and replaced once at the end, two
  messages instead of the ~30 comm messages of a widget's life (which cost a
  quick cell ~13 ms, five times the pool's own ~2.5 ms). When the cell ends the
  widgets are closed and the static HTML form replaces them;
- ``HtmlDisplay``: a text/html display updated in place (a kernel without ipywidgets);
- ``TextDisplay``: nothing live; the summary is displayed when the cell ends (plain IPython);
- ``OffDisplay``: nothing at all.

The presenter (status_view.StatusView) owns the throttling, the ticker and the
words; a display only decides what goes on the page and when it may.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Dict, Optional, Protocol, Type

from . import status_render as R

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
Bundle = Dict[str, Any]


class Presenter(Protocol):
    """What a display needs from the view that owns it (status_view.StatusView)."""

    clock: Callable[[], float]
    live_after: float
    started_at: float
    shown: bool

    def render(self) -> None: ...

    def bundle(self, widget: bool = True) -> Bundle: ...

    def snapshot(self) -> R.Snapshot: ...

    def put(self, bundle: Bundle) -> None: ...

    def replace(self, bundle: Bundle) -> None: ...


class Display(ABC):
    """One front end's way of showing the view."""

    live = False  # re-rendered in place while the cell runs (the view keeps a ticker for it)

    def __init__(self, view: Presenter) -> None:
        self.view = view

    def first_bundle(self) -> Optional[Bundle]:
        """What goes up at the top of the cell's output when the view is shown; None: nothing yet."""
        return None

    def holds(self) -> bool:
        """Whether a due render must wait (the view stays dirty and renders later)."""
        return False

    def due(self) -> Optional[float]:
        """A moment (the view's clock) at which this display must render whatever else is due; None: none."""
        return None

    def widget_bundle(self) -> Bundle:
        """The widget's part of a display bundle, while there is a widget."""
        return {}

    @abstractmethod
    def render(self) -> None:
        """Bring what is on the page up to date (the view renders only live displays while the cell runs)."""

    @abstractmethod
    def finish(self) -> None:
        """The cell ended: leave the final form on the page."""


class OffDisplay(Display):
    def render(self) -> None:
        pass  # nothing is shown

    def finish(self) -> None:
        pass  # nothing was shown, nothing is left


class TextDisplay(Display):
    def render(self) -> None:
        pass  # nothing live: the summary comes when the cell ends

    def finish(self) -> None:
        self.view.put({"text/plain": R.final_text(self.view.snapshot())})


class HtmlDisplay(Display):
    live = True

    def first_bundle(self) -> Optional[Bundle]:
        return self.view.bundle(widget=False)

    def render(self) -> None:
        self.view.replace(self.view.bundle(widget=False))

    def finish(self) -> None:
        if self.view.shown:
            self.view.render()


class WidgetDisplay(Display):
    live = True

    def __init__(self, view: Presenter) -> None:
        super().__init__(view)
        self.widgets: Dict[str, Any] = {}

    @property
    def built(self) -> bool:
        """Whether the ipywidgets exist (built only for a cell that runs a while)."""
        return "root" in self.widgets

    def first_bundle(self) -> Optional[Bundle]:
        if self.view.live_after <= 0:
            self._build()
        # Before it goes live only the summary line: a quick cell's placeholder should cost
        # little, its tables come with the final summary.
        return self.view.bundle(widget=True) if self.built else {"text/html": R.brief_html(self.view.snapshot())}

    def holds(self) -> bool:
        return not self.built and self.view.clock() - self.view.started_at < self.view.live_after

    def due(self) -> Optional[float]:
        return None if self.built else self.view.started_at + self.view.live_after

    def widget_bundle(self) -> Bundle:
        if not self.built:
            return {}
        return {WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.widgets["root"].model_id}}

    def render(self) -> None:
        if not self.built:  # the cell is taking a while: the static summary at the top becomes the live widget
            self._build()
            self.view.replace(self.view.bundle(widget=True))
            return
        w, s = self.widgets, self.view.snapshot()
        w["header"].value = R.header_html(s)
        w["ranks"].value = R.ranks_html(s)
        env = R.env_html(s)
        if w["env"].value != env:
            w["env"].value = env

    def finish(self) -> None:
        if not self.view.shown:
            return
        if not self.built:
            self.view.replace(self.view.bundle(widget=False))  # a quick cell: its summary, never a widget
            return
        self.view.render()
        self.widgets["details"].selected_index = None  # settled: the one-line summary
        # What stays in the notebook is the static form (the same summary, the tables behind
        # <details>): it renders after a reload, in nbviewer, on GitHub and in VS Code without
        # a widget manager or saved widget state. The widgets go.
        self.view.replace(self.view.bundle(widget=False))
        self._close()

    def _build(self) -> None:
        import ipywidgets as W

        s = self.view.snapshot()
        self.widgets["header"] = W.HTML(value=R.header_html(s), layout=W.Layout(margin="0 0 2px 0"))
        self.widgets["ranks"] = W.HTML(value=R.ranks_html(s))
        self.widgets["env"] = W.HTML(value=R.env_html(s))
        details = W.Accordion(children=[self.widgets["ranks"], self.widgets["env"]], titles=("Ranks", "Env validation"), selected_index=0)
        self.widgets["details"] = details
        self.widgets["root"] = W.VBox([self.widgets["header"], details], layout=W.Layout(width="100%"), _dom_classes=("ddp-status",))

    def _close(self) -> None:
        """Close every model the view opened (its layouts and styles too), so none lingers in the kernel."""
        models = []
        for w in self.widgets.values():
            models += [getattr(w, "layout", None), getattr(w, "style", None), w]
        seen = set()
        for m in models:
            if m is not None and id(m) not in seen and hasattr(m, "close"):
                seen.add(id(m))
                m.close()


DISPLAYS: Dict[str, Type[Display]] = {"widget": WidgetDisplay, "html": HtmlDisplay, "text": TextDisplay, "off": OffDisplay}


def make_display(mode: str, view: Presenter) -> Display:
    try:
        return DISPLAYS[mode](view)
    except KeyError:
        raise ValueError(f"status view mode {mode!r}: use one of {', '.join(DISPLAYS)}") from None
