"""dashgen's version: part of every cache key (a new version compiles and plans afresh)."""
__version__ = "0.2.0"
