"""The report's figures drawn once and kept while what they are drawn from is unchanged.

A figure of the report is kept as the HTML it embeds (its PNG, caption and notes) in
`OUTPUT_DIR/.figures/<key>.json`, where the key is the SHA-256 of exactly what the figure is drawn from (the
rows of the results table it draws, its options and caption, the time-series file of a point) and of the
code that draws it (the source of the raysweep package; the versions of matplotlib, numpy, pandas and
Pillow). A report written again on unchanged data (`raysweep report` after `run` drew it) embeds the kept
figures without importing matplotlib; a changed campaign (new runs, a resumed one), another `--objective`
(the star of a card) or another version of raysweep draws the figures whose inputs changed. An entry that
cannot be read or does not hold what its name says is drawn again and replaced; nothing here stops a report.

A report written into the output dir (`raysweep report OUTPUT_DIR`, the end of `run`) uses the folder and
writes it: it then holds the figures of the last such report (the others are removed). A report written
elsewhere (`--out`, `Campaign.report`) uses what is kept and writes nothing into the output dir;
`build_report` draws every figure and writes nothing. A figure that fails to draw is never kept.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysweep.record.files import write_text_atomic

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FOLDER", "FigureCache", "active", "cached", "using"]

log = logging.getLogger(__name__)

FOLDER = ".figures"
_FORMAT = 1  # of an entry: {"format", "key", "sha256", "html"}
_ACTIVE: contextvars.ContextVar[FigureCache | None] = contextvars.ContextVar("raysweep_figure_cache", default=None)


class FigureCache:
    """The kept figures of one output dir, used by one report: what it found (`hits`), what it drew
    (`drawn`), the keys it used (the rest is removed by `prune`)."""

    def __init__(self, folder: Path, keep: bool = True) -> None:
        self.folder = folder
        self.hits = 0
        self.drawn = 0
        self.used: set[str] = set()
        self._writable = keep  # whether what is drawn is kept
        self._frames: dict[int, tuple[Any, str]] = {}  # id -> (frame, digest): a frame hashed once per report

    def html(self, parts: Sequence[Any], make: Callable[[], str]) -> str:
        """The kept HTML of the figure drawn from `parts`; else `make()`, kept. An exception of `make`
        propagates and nothing is kept."""
        key = self.key(parts)
        self.used.add(key)
        found = self._read(key)
        if found is not None:
            self.hits += 1
            return found
        text = make()
        self.drawn += 1
        self._write(key, text)
        return text

    def has(self, parts: Sequence[Any]) -> bool:
        """Whether the figure drawn from `parts` is kept (then `html` reads it rather than drawing it)."""
        return self._read(self.key(parts)) is not None

    def key(self, parts: Sequence[Any]) -> str:
        h = hashlib.sha256(_code_stamp().encode())
        for part in parts:
            self._feed(h, part)
        return h.hexdigest()

    def prune(self) -> int:
        """Remove the entries this report did not use; how many were removed."""
        removed = 0
        for path in self.folder.glob("*.json") if self.folder.is_dir() else ():
            if path.stem not in self.used:
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed += 1
        return removed

    def _feed(self, h: hashlib._Hash, part: object) -> None:
        if isinstance(part, bytes):
            h.update(b"b%d:" % len(part) + part)
        elif hasattr(part, "columns") and hasattr(part, "dtypes"):  # a DataFrame
            h.update(b"f:" + self._frame_digest(part).encode())
        else:
            text = repr(part).encode()
            h.update(b"r%d:" % len(text) + text)

    def _frame_digest(self, df: pd.DataFrame) -> str:
        kept = self._frames.get(id(df))
        if kept is not None and kept[0] is df:
            return kept[1]
        digest = frame_digest(df)
        self._frames[id(df)] = (df, digest)
        return digest

    def _read(self, key: str) -> str | None:
        path = self.folder / f"{key}.json"
        try:
            entry = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.info("kept figure %s unreadable, drawn again: %s", path.name, exc)
            return None
        text = entry.get("html") if isinstance(entry, dict) else None
        if (not isinstance(text, str) or entry.get("format") != _FORMAT or entry.get("key") != key
                or entry.get("sha256") != hashlib.sha256(text.encode()).hexdigest()):
            log.info("kept figure %s does not hold what its name says, drawn again", path.name)
            return None
        return text

    def _write(self, key: str, text: str) -> None:
        if not self._writable:
            return
        entry = {"format": _FORMAT, "key": key, "sha256": hashlib.sha256(text.encode()).hexdigest(), "html": text}
        try:
            write_text_atomic(self.folder / f"{key}.json", json.dumps(entry))
        except OSError as exc:  # a read-only campaign dir: the report is written elsewhere, its figures not kept
            log.info("figures not kept in %s: %s", self.folder, exc)
            self._writable = False


def frame_digest(df: pd.DataFrame) -> str:
    """The SHA-256 of a DataFrame's content: column names and types, index, and every value (pandas' own
    row hash; a column it cannot hash, such as one of lists, by the repr of its values)."""
    import pandas as pd

    h = hashlib.sha256(repr((list(map(str, df.columns)), [str(t) for t in df.dtypes], len(df))).encode())
    h.update(pd.util.hash_pandas_object(df.index).to_numpy().tobytes())
    for i in range(df.shape[1]):
        col = df.iloc[:, i]
        try:
            values = pd.util.hash_pandas_object(col, index=False).to_numpy().tobytes()
        except TypeError:
            values = repr(col.tolist()).encode()
        h.update(values)
    return h.hexdigest()


@cache
def _code_stamp() -> str:
    """What draws the figures: the raysweep package's source and the versions of the libraries drawing and
    encoding them. Any change draws every figure again."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    for dist in ("matplotlib", "numpy", "pandas", "pillow"):
        try:
            h.update(f"{dist}={metadata.version(dist)};".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=none;".encode())
    return h.hexdigest()


@contextlib.contextmanager
def using(figures: FigureCache | None) -> Iterator[FigureCache | None]:
    """Make `figures` the cache of the report being made (`cached` uses it), for the `with` block."""
    token = _ACTIVE.set(figures)
    try:
        yield figures
    finally:
        _ACTIVE.reset(token)


def active() -> FigureCache | None:
    """The cache of the report being made (`using`); None when there is none."""
    return _ACTIVE.get()


def cached(parts: Callable[[], Sequence[Any]] | Sequence[Any], make: Callable[[], str]) -> str:
    """A figure's HTML through the cache of the report being made (`using`), or `make()` when there is none.
    `parts` may be a function, called only when a cache is in use (it may read files)."""
    figures = _ACTIVE.get()
    if figures is None:
        return make()
    return figures.html(parts() if callable(parts) else parts, make)
