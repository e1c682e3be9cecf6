"""Mirroring an output directory to a filesystem URI, and reading a mirrored campaign back.

A campaign with `storage: s3://bucket/prefix` (or `gs://`, `hdfs://`, `file:///...`: any filesystem pyarrow
knows) has its output directory copied there after every finished or failed point and at the end, so
results survive a cluster that goes away and can be read from anywhere: `raysweep results s3://...`.

- The ledger is copied as a consistent snapshot (SQLite's online backup into a temporary file): a live
  database in WAL mode is never copied file by file.
- Every other file is copied when its size or modification time changed since the last sync.
- Each file is written under a temporary name and then moved into place, where the filesystem can move
  (object stores write whole objects anyway), so a reader never sees half a file.
- A failing mirror logs a warning and never fails the campaign: the output directory stays the truth.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysweep.errors import UserError
from raysweep.ledger import LEDGER_FILE

if TYPE_CHECKING:
    from raysweep.record.directory import CampaignDir

__all__ = ["Mirror", "fetch", "is_uri", "resolve_output", "restore"]

log = logging.getLogger(__name__)

_SKIP = {LEDGER_FILE, f"{LEDGER_FILE}-wal", f"{LEDGER_FILE}-shm", f"{LEDGER_FILE}-journal"}
_CHUNK = 4 * 1024 * 1024


def is_uri(text: str) -> bool:
    return "://" in text


def _filesystem(uri: str, field: str = "storage") -> tuple[Any, str]:
    from pyarrow import fs

    try:
        return fs.FileSystem.from_uri(uri)
    except Exception as exc:
        raise UserError(f"{field} {uri!r}: not a filesystem URI pyarrow can open ({exc}); accepted: "
                        "s3://bucket/prefix, gs://bucket/prefix, hdfs://..., file:///absolute/path") from None


class Mirror:
    """Copies a campaign's directory to `uri`. `request()` asks for a copy and returns at once: a background thread
    copies what changed, folding requests that arrive meanwhile into one, so a slow store never delays a
    point. `close()` makes a last copy and waits for it."""

    def __init__(self, uri: str, directory: CampaignDir) -> None:
        self.uri = uri
        self.output_dir = directory.path
        self.fs, self.base = _filesystem(uri)
        self._seen: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.syncs = 0

    def request(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="raysweep-mirror", daemon=True)
            self._thread.start()
        self._wanted.set()

    def close(self) -> bool:
        """The last copy (everything the run wrote); False when it failed."""
        self._closing = True
        self._wanted.set()
        if self._thread is not None:
            self._thread.join()
        return self.sync()

    def _loop(self) -> None:
        while not self._closing:
            self._wanted.wait()
            self._wanted.clear()
            if not self._closing:
                self.sync()

    def sync(self) -> bool:
        """Copy what changed now; False (and a warning) when the mirror failed."""
        with self._lock:
            try:
                self._sync()
            except Exception as exc:
                log.warning("could not mirror %s to %s: %s: %s", self.output_dir, self.uri, type(exc).__name__, exc)
                return False
            self.syncs += 1
            return True

    def _sync(self) -> None:
        self.fs.create_dir(self.base, recursive=True)
        ledger = self.output_dir / LEDGER_FILE
        if ledger.is_file():
            with tempfile.TemporaryDirectory(prefix="raysweep-mirror-") as tmp:
                snap = Path(tmp) / LEDGER_FILE
                _snapshot(ledger, snap)
                self._put(snap, LEDGER_FILE)
        for path in sorted(self.output_dir.rglob("*")):
            rel = path.relative_to(self.output_dir).as_posix()
            if not path.is_file() or rel in _SKIP or ".tmp" in path.name:
                continue
            st = path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
            if self._seen.get(rel) == stamp:
                continue
            self._put(path, rel)
            self._seen[rel] = stamp

    def _put(self, local: Path, rel: str) -> None:
        dest = f"{self.base.rstrip('/')}/{rel}"
        parent = dest.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        part = f"{dest}.part-{os.getpid()}"
        with open(local, "rb") as src, self.fs.open_output_stream(part) as out:
            while chunk := src.read(_CHUNK):
                out.write(chunk)
        self.fs.move(part, dest)


def _snapshot(db: Path, dest: Path) -> None:
    """A consistent copy of a live SQLite database (online backup; readers and writers go on)."""
    src = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        out = sqlite3.connect(dest)
        try:
            src.backup(out)
        finally:
            out.close()
    finally:
        src.close()


def fetch(uri: str, dest: str | Path) -> Path:
    """Download a mirrored campaign into `dest` (files that are already there with the same size are kept)."""
    from pyarrow import fs

    filesystem, base = _filesystem(uri, "OUTPUT_DIR")
    info = filesystem.get_file_info(base)
    if info.type == fs.FileType.NotFound:
        raise UserError(f"OUTPUT_DIR {uri}: nothing is there (no mirrored campaign)")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for entry in filesystem.get_file_info(fs.FileSelector(base, recursive=True)):
        if entry.type != fs.FileType.File or ".part-" in entry.base_name:
            continue
        rel = entry.path[len(base.rstrip("/")) + 1:]
        target = dest / rel
        if target.is_file() and target.stat().st_size == entry.size and rel != LEDGER_FILE:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        with filesystem.open_input_stream(entry.path) as src, open(tmp, "wb") as out:
            while chunk := src.read(_CHUNK):
                out.write(chunk)
        os.replace(tmp, target)
    if not (dest / LEDGER_FILE).is_file():
        raise UserError(f"OUTPUT_DIR {uri}: no raysweep ledger there ({LEDGER_FILE} is missing)")
    return dest


def restore(uri: str, directory: CampaignDir) -> bool:
    """Before a campaign starts: an output dir without a ledger takes the mirrored one, if there is one (a job
    submitted again on a cluster whose disks were replaced resumes from its mirror). False when none."""
    output_dir = directory.path
    if (output_dir / LEDGER_FILE).is_file():
        return False
    from pyarrow import fs

    filesystem, base = _filesystem(uri)
    if filesystem.get_file_info(f"{base.rstrip('/')}/{LEDGER_FILE}").type != fs.FileType.File:
        return False
    fetch(uri, output_dir)
    log.warning("%s had no ledger: restored the campaign mirrored at %s", output_dir, uri)
    return True


def resolve_output(arg: str, to: str | Path | None = None) -> Path:
    """An OUTPUT_DIR argument as a local directory: a URI is downloaded first (into `to`, or a cache dir
    under ~/.cache/raysweep/mirrors named after the URI)."""
    if not is_uri(arg):
        return Path(arg)
    if to is None:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raysweep" / "mirrors"
        to = cache / hashlib.sha256(arg.encode()).hexdigest()[:16]
    return fetch(arg, to)
