"""Sources: each reads committed changes from one system and yields chunks of events."""

from deltaforge.sources.base import PositionLost, Source, SourceError

__all__ = ["PositionLost", "Source", "SourceError"]
