"""Figures without pyplot's global state.

Library code draws on a ``matplotlib.figure.Figure`` it creates itself: no
backend switch (``matplotlib.use('Agg')`` would silently stop a notebook's
inline plots), no figure registry to leak into, and PNGs are written
atomically. A notebook displays the returned figure like any other.
"""
from matplotlib import rcParams
from matplotlib.figure import Figure

from .output import atomic_path

__all__ = ["new_figure", "save_png", "color_cycle"]


def new_figure(nrows=1, ncols=1, figsize=(8, 4.5)):
    """A detached figure and its axes (``Figure.subplots`` semantics)."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols)


def save_png(fig, path, dpi=120, legend=None):
    """Lay out and write ``fig`` as a PNG at ``path``, atomically; returns ``path``.

    ``legend`` is an Axes to draw the legend on first.
    """
    if legend is not None:
        legend.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    return path


def color_cycle():
    """matplotlib's default colour sequence."""
    return rcParams["axes.prop_cycle"].by_key()["color"]
