"""gpuwhy: why is this GPU not busy, and what broke it."""

__version__ = "0.1.0"
