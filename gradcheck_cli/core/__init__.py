"""Plain values: tolerances, seeds, printable text (no torch where a module says so)."""
