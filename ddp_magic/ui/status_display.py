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
from collections import deque
from typing import Any, Callable, Deque, Dict, Optional, Protocol, Type

from ..logs import log
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
    ticks_clock = False  # can send the one-line header alone, so the live clock moves between renders

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

    def render_clock(self) -> None:  # noqa: B027 (a no-op unless the display ticks_clock)
        """Bring the one-line header (its clock) up to date alone (only a display that ``ticks_clock``)."""

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
    ticks_clock = True

    def __init__(self, view: Presenter) -> None:
        super().__init__(view)
        self.widgets: Dict[str, Any] = {}
        self.opened = False  # the body was opened by the view itself (once: a user who closes it keeps it closed)

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
        if not self.opened and R.opens_itself(s):  # a chart or a progress bar to watch: open the body, once
            self.opened = True
            w["stack"].selected_index = 1
            w["toggle"].index = 1

    def render_clock(self) -> None:
        if self.built:
            value = R.header_html(self.view.snapshot())
            if self.widgets["header"].value != value:
                self.widgets["header"].value = value

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
        """Close every model the view opened (its layouts and styles too), so none lingers in the kernel; a
        stand-in takes each one's late messages (see ``_Closed``)."""
        models = []
        for w in self.widgets.values():
            models += [getattr(w, "layout", None), getattr(w, "style", None), w]
        seen = set()
        for m in models:
            if m is not None and id(m) not in seen and hasattr(m, "close"):
                seen.add(id(m))
                comm = getattr(m, "comm", None)
                m.close()
                if comm is not None:
                    _Closed.stand_in(comm.comm_id)


class _Closed:
    """Stands in the kernel's comm manager for a widget model a view closed. The browser's messages on it (the ▾
    toggle's index, the jslink's stack index) wait for the main shell, where ipykernel routes a comm's messages when
    the kernel last sent on it from a cell: they are handled only after the cell that closed the model has ended.
    Without a stand-in each one is a "No such comm" in the kernel's log, shown in JupyterLab's log console. Its
    target is not ``jupyter.widget``, so a page that reloads never asks it for a widget's state."""

    target_name = "ddp_magic.closed-widget"
    KEPT = 512  # the last ~28 views' models (18 each): the messages of older ones were handled long ago
    _kept: "Deque[_Closed]" = deque()

    def __init__(self, comm_id: str) -> None:
        self.comm_id = comm_id
        self._closed = True

    @classmethod
    def stand_in(cls, comm_id: str) -> None:
        try:
            import comm as comms

            manager = comms.get_comm_manager()
            stand_in = cls(comm_id)
            manager.register_comm(stand_in)  # type: ignore[arg-type]  # what a comm manager calls on a comm, no more
            cls._kept.append(stand_in)
            while len(cls._kept) > cls.KEPT:
                manager.comms.pop(cls._kept.popleft().comm_id, None)
        except Exception:  # no comm manager (not a kernel): nobody can send to the model anyway
            log.debug("status view: no stand-in for a closed widget", exc_info=True)

    def handle_msg(self, msg: Dict[str, Any]) -> None:
        log.debug("status view: a late message for closed widget %s dropped", self.comm_id)

    def handle_close(self, msg: Dict[str, Any]) -> None:
        log.debug("status view: the browser closed widget %s too", self.comm_id)


DISPLAYS: Dict[str, Type[Display]] = {"widget": WidgetDisplay, "html": HtmlDisplay, "text": TextDisplay, "off": OffDisplay}


def make_display(mode: str, view: Presenter) -> Display:
    try:
        return DISPLAYS[mode](view)
    except KeyError:
        raise ValueError(f"status view mode {mode!r}: use one of {', '.join(DISPLAYS)}") from None
