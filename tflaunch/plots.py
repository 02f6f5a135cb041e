"""matplotlib for the PNGs that commands draw (sweeps, progress, netbench, trace timelines),
imported only when one is drawn."""

from __future__ import annotations

from tflaunch.errors import TflaunchError


def pyplot():
    """matplotlib's pyplot on the Agg backend; a clear error where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise TflaunchError(
            "plots need matplotlib; install it (pip install 'tflaunch[tf]') or read results.csv."
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
