"""DFlash drafter training and data tooling."""

__version__ = "0.1.0"
