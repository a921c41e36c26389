"""The clock lives with the machine (hardware/timing.py) so that calibration and every experiment share it without
the hardware layer importing experiments; this module keeps the old import path."""
from ..hardware.timing import interleaved, median, synchronize, timed

__all__ = ["interleaved", "median", "synchronize", "timed"]
