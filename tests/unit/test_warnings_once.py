"""A warning of the code under test is shown once per case, whatever the checks do to the warning filters.

Python shows a warning once per place until the filters change; every ``warnings.catch_warnings`` block (the
checks', torch's, the guard's restore of the filters) changes them, so before ``state.warnings_once`` a
Function's ``warnings.warn`` reached stderr once per check. The filters' own decisions still hold.
"""

from __future__ import annotations

import warnings

import pytest

from gradcheck_cli.sandbox import state_guard


def _warn() -> None:
    warnings.warn("the code under test says hello", UserWarning, stacklevel=1)


def _three_checks() -> None:
    """Three calls, each in a block that changes the filters and puts them back, as a check does."""
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="some note of torch's")
            _warn()


def _shown(action: str, cases: int = 1) -> list[str]:
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter(action)
        for _ in range(cases):
            with state_guard.warnings_once():
                _three_checks()
    return [str(w.message) for w in log]


def test_a_warning_is_shown_once_per_case_however_often_the_filters_change() -> None:
    assert _shown("default") == ["the code under test says hello"]


def test_each_case_shows_it_again() -> None:
    assert _shown("default", cases=2) == ["the code under test says hello"] * 2


def test_an_always_filter_still_shows_every_one() -> None:
    assert _shown("always") == ["the code under test says hello"] * 3


def test_an_ignore_filter_still_hides_it_and_an_error_filter_still_raises() -> None:
    assert _shown("ignore") == []
    with pytest.raises(UserWarning, match="says hello"):
        _shown("error")


def test_the_way_warnings_are_shown_is_put_back_after_the_case() -> None:
    before = warnings.showwarning
    with state_guard.warnings_once():
        assert warnings.showwarning is not before
    assert warnings.showwarning is before
