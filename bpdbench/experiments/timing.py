"""The clock lives with the machine (hardware/timing.py), so calibration and every experiment share one clock and
one interleaving without the hardware layer importing experiments; experiments import it from here."""
from __future__ import annotations

from ..hardware.timing import interleaved, median, synchronize, timed

__all__ = ["interleaved", "median", "synchronize", "timed"]
