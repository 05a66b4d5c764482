"""Optional gap plot: microbench vs profiled duration per row, log-log, with the [0.8, 1.2] band.

matplotlib is not a dependency: without it ``plot_gap`` writes nothing and returns None.  The
figure is drawn through matplotlib's object API with the Agg canvas, never ``pyplot``, so it
neither needs a display nor touches the global figure state of a process that also plots.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

from perf_plugin.database.atomic import atomic_write_bytes
from perf_plugin.report.gap import GAP_BAND, is_flagged
from perf_plugin.results import GapRow


def plot_gap(path: str | Path, gaps: Iterable[GapRow]) -> Path | None:
    """Write a PNG scatter of the rows that have both durations; None if there is nothing to plot
    or matplotlib is not installed."""
    points = [g for g in gaps if g.ratio is not None and g.microbench_us]
    if not points:
        return None
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return None

    figure = Figure(figsize=(6.4, 6.0), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    inside = [g for g in points if not is_flagged(g)]
    outside = [g for g in points if is_flagged(g)]
    for group, colour, label in ((inside, "tab:blue", "within band"), (outside, "tab:red", "outside band")):
        if group:
            # Markers on a line without segments: drawn as one path, far faster than ``scatter``
            # for the tens of thousands of rows of a large run.
            axes.plot([g.profiling_us or 0.0 for g in group], [g.microbench_us or 0.0 for g in group], linestyle="none",
                      marker="o", markersize=3.5, color=colour, label=f"{label} ({len(group)})")
    values = [v for g in points for v in (g.profiling_us, g.microbench_us) if v]
    low, high = min(values) / 1.5, max(values) * 1.5
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlim(low, high)
    axes.set_ylim(low, high)
    axes.plot([low, high], [low, high], color="black", linewidth=0.8, label="equal")
    for factor, band_label in zip(GAP_BAND, ("band", None)):
        axes.plot([low, high], [low * factor, high * factor], color="grey", linewidth=0.6, linestyle="--",
                  label=band_label)
    for axis in (axes.xaxis, axes.yaxis):
        axis.set_minor_formatter(NullFormatter())  # labelled minor ticks overlap on short ranges
    axes.set_xlabel("profiling average duration (us)")
    axes.set_ylabel("microbench average duration (us)")
    axes.set_title(f"microbench vs profiling, band [{GAP_BAND[0]:g}, {GAP_BAND[1]:g}]")
    axes.legend(loc="upper left", fontsize="small")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    target = Path(path)
    atomic_write_bytes(target, buffer.getvalue())
    return target
