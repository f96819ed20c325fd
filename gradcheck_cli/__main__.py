"""``python -m gradcheck_cli``: the same as the ``gradcheck`` command."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
