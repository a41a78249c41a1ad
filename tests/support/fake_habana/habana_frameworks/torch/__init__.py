"""Stand-in for habana_frameworks.torch: only the version the real plugin reports."""

__version__ = "1.21.0.555"
