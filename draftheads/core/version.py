"""The one place the package version is written (pyproject.toml carries the same number)."""

__version__ = "0.1.0"
