"""``python -m gradcheck_cli`` and the ``gradcheck`` console script (``main``).

Ctrl-C exits 130 from here on, as the contract says of an interrupted run: while the command line is
imported (``_before_the_run``: nothing was checked, nothing is to be reported) and, once it runs, by its own
handling (``cli.main``). Python's default would print a KeyboardInterrupt traceback here, and click's would
exit 1 ("Aborted!"), which a CI job reads as a failed check.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, NoReturn, Optional

INTERRUPTED = 130  # results.ExitCode.INTERRUPTED (not imported: this module is the first to run)


def _before_the_run(signum: int, frame: Any) -> NoReturn:
    raise SystemExit(INTERRUPTED)


if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, _before_the_run)

from .cli import main as _main  # noqa: E402 - after the handler: this import takes most of the start


def main(argv: Optional[list[str]] = None) -> Any:
    """The command line, with Python's own Ctrl-C handling (KeyboardInterrupt) back for the run."""
    if signal.getsignal(signal.SIGINT) is _before_the_run:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return _main(argv)


if __name__ == "__main__":
    main()
