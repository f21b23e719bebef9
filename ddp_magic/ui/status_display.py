"""How the status view reaches the page: one small strategy per front end, chosen once.

``status.choose_mode`` names the mode, ``make_display`` turns it into one of:

- ``WidgetDisplay``: stock ipywidgets updated live over the comm (a kernel with
  ipywidgets). A cell that ends within ``live_after`` seconds never builds them,
  and shows nothing until it ends: one small display message then (a placeholder
  goes up first only when a rank prints, so that the view stays above the
  output), instead of the ~30 comm messages of a widget's life. When the cell
  ends the widgets are closed and the static HTML form replaces them;
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
from . import status_tables as T

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

    def placeholder(self) -> Bundle:
        """What goes up before a rank's first output when nothing is shown yet: the summary line alone."""
        return {"text/html": T.brief_html(self.view.snapshot())}

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
        self.view.put({"text/plain": T.final_text(self.view.snapshot())})


class HtmlDisplay(Display):
    live = True

    def holds(self) -> bool:
        return self.view.clock() - self.view.started_at < self.view.live_after

    def due(self) -> Optional[float]:
        return self.view.started_at + self.view.live_after if self.holds() else None

    def render(self) -> None:
        self.view.replace(self.view.bundle(widget=False))

    def finish(self) -> None:
        if self.view.shown:
            self.view.replace(self.view.bundle(widget=False))


class WidgetDisplay(Display):
    """Live: one line (the summary, with a square or a small bar per rank) and a ▸/▾ toggle that opens the
    rank table and the env below it, in the browser alone (a jslink: no kernel round trip while the cell runs).
    Every update is a widget trait (an HTML value): never Output.append_* from a thread, which VS Code drops."""

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
            return self.view.bundle(widget=True)
        return None  # a quick cell shows one display, at its end (or a placeholder before a rank's first output)

    def holds(self) -> bool:
        return not self.built and self.view.clock() - self.view.started_at < self.view.live_after

    def due(self) -> Optional[float]:
        return None if self.built else self.view.started_at + self.view.live_after

    def widget_bundle(self) -> Bundle:
        if not self.built:
            return {}
        return {WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.widgets["root"].model_id}}

    def render(self) -> None:
        if not self.built:  # the cell is taking a while: the summary at the top becomes the live widget
            self._build()
            self.view.replace(self.view.bundle(widget=True))
            return
        w, s = self.widgets, self.view.snapshot()
        for name, value in (("header", R.header_html(s)), ("body", T.body_html(s))):
            if w[name].value != value:
                w[name].value = value

    def finish(self) -> None:
        if not self.view.shown:
            return
        if not self.built:
            self.view.replace(self.view.bundle(widget=False))  # a quick cell: its summary, never a widget
            return
        self.view.render()
        # What stays in the notebook is the static form (the same line, the tables behind
        # <details>): it renders after a reload, in nbviewer, on GitHub and in VS Code without
        # a widget manager or saved widget state. The widgets go.
        self.view.replace(self.view.bundle(widget=False))
        self._close()

    def _build(self) -> None:
        import ipywidgets as W

        s = self.view.snapshot()
        header = W.HTML(value=R.header_html(s), layout=W.Layout(margin="0", flex="1 1 auto", overflow="hidden"))
        toggle = W.ToggleButtons(options=[("▸", 0), ("▾", 1)], value=0, tooltips=["hide the ranks and the env", "show the ranks and the env"],
                                 style={"button_width": "22px"}, layout=W.Layout(margin="0 4px 0 0", flex="0 0 auto", width="auto"))
        body = W.HTML(value=T.body_html(s))
        stack = W.Stack(children=[W.Box(), body], selected_index=0)  # an empty Box: no height while closed
        link = W.jslink((toggle, "index"), (stack, "selected_index"))
        line = W.HBox([toggle, header], layout=W.Layout(align_items="center", width="100%"))
        self.widgets.update(header=header, body=body, toggle=toggle, stack=stack, link=link, line=line, empty=stack.children[0])
        self.widgets["root"] = W.VBox([line, stack], layout=W.Layout(width="100%"), _dom_classes=("ddp-status", "ddp-status-live"))

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
