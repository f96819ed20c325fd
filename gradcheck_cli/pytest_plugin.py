"""pytest plugin (entry point ``pytest11``): ``pytest --gradcheck specs/`` collects specs as tests.

Inert unless ``--gradcheck`` is given; importing it does not import torch.
"""
from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gradcheck", "gradcheck-cli")
    group.addoption("--gradcheck", action="store_true", default=False,
                    help="collect gradcheck-cli spec files (*.yaml, *.yml) given as arguments as tests")
