"""Where log records go while a command uses Ray.

The terminal shows raysweep's warnings and errors, and Ray's errors; Ray's own notices (the
token-authentication warning of every embedded start, "Started a local Ray instance", ...) and every
record at INFO go to the campaign's log file, OUTPUT_DIR/logs/raysweep.log, instead. `-v` shows Ray's
notices on the terminal as well.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

LOG_FILE = Path("logs") / "raysweep.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

verbosity = 0  # the count of -v, set by the command group


def _is_terminal(h: logging.Handler) -> bool:
    return isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)


class _Drop(logging.Filter):
    def __init__(self, drop: Callable[[logging.LogRecord], bool]) -> None:
        super().__init__()
        self.drop = drop

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.drop(record)


@contextlib.contextmanager
def routed(log_file: Path | None = None, drop: Callable[[logging.LogRecord], bool] | None = None) -> Iterator[None]:
    """Route records as the module says while the block runs: Ray's notices off the terminal (unless -v),
    everything at INFO into `log_file` (when given), and records `drop` selects (what the progress display
    already says) off the terminal."""
    import ray  # noqa: F401  (Ray gives its logger a terminal handler when it is imported)

    root, ray_log = logging.getLogger(), logging.getLogger("ray")
    saved: list[tuple[logging.Handler, int]] = []
    added: list[tuple[logging.Logger, logging.Handler]] = []
    filters: list[tuple[logging.Handler, logging.Filter]] = []
    root_level = root.level
    try:
        if verbosity == 0:
            for h in filter(_is_terminal, ray_log.handlers):
                saved.append((h, h.level))
                h.setLevel(max(h.level, logging.ERROR))
        if drop is not None:
            for h in filter(_is_terminal, root.handlers):
                f = _Drop(drop)
                h.addFilter(f)
                filters.append((h, f))
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(log_file)
            handler.setFormatter(logging.Formatter(FORMAT))
            handler.setLevel(logging.INFO)
            for h in filter(_is_terminal, root.handlers):  # the terminal keeps the level it had
                saved.append((h, h.level))
                h.setLevel(max(h.level, root_level))
            root.setLevel(min(root_level, logging.INFO))
            for lg in (root, ray_log):
                lg.addHandler(handler)
                added.append((lg, handler))
        yield
    finally:
        for lg, h in added:
            lg.removeHandler(h)
        for h, flt in filters:
            h.removeFilter(flt)
        for h, level in reversed(saved):
            h.setLevel(level)
        root.setLevel(root_level)
        for h in {h for _, h in added}:
            h.close()
