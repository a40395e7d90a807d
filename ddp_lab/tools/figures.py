"""matplotlib for the tools that draw (bench, costmodel): the Agg backend, so plots
are written on headless nodes too. Imported only when a figure is drawn."""
from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (works on headless nodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
