"""What the machine can do, measured: its fingerprint, the dtype that is fast on it, the calibrated cost of a
forward over n tokens, and the draft shapes those costs make worth verifying.

Layering: hardware sits beside the engine (it imports models and the engine's tree masks, never methods,
experiments or training), so every layer above can ask it what a forward costs here.
"""
