"""The version of gradcheck-cli: the one place it is written (pyproject.toml reads it from here)."""

from __future__ import annotations

__version__ = "0.1.0"
