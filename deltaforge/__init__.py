"""deltaforge: change-data-capture on supervised actors."""

__version__ = "0.1.0"
