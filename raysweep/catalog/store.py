"""The catalogue on disk: a directory a team can share.

    CATALOG/catalog.json          the index: format version, one entry per campaign (id, name, source, path,
                                  signature, complete, runs, points, added and updated times, models,
                                  hardware, versions, first and last date)
    CATALOG/runs/<id>.parquet     the campaign's runs, one row each (`fields.COLUMNS`)

Queries run in DuckDB over the Parquet files the index names (a view `runs`, and `campaigns` from the
index); every file holds the same columns (`fields.COLUMNS` of this format). A query filtered on a model,
a hardware or a campaign reads only the files of the campaigns whose index entry can match (`select`).
`add` reads every campaign first and writes only when all were read: a bad directory leaves the catalogue
as it was. A campaign already there with the same signature is left alone (adding twice adds nothing); one
whose signature changed (a campaign that was still running) is replaced. A catalogue written by a newer format than this
raysweep reads is refused, unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysweep.catalog import sources
from raysweep.errors import UserError
from raysweep.record.files import write_bytes_atomic, write_json_atomic

if TYPE_CHECKING:
    import duckdb
    import pandas as pd

__all__ = ["FORMAT", "INDEX_FILE", "AddReport", "Catalog"]

log = logging.getLogger(__name__)

FORMAT = 1
INDEX_FILE = "catalog.json"
RUNS_DIR = "runs"


@dataclass
class AddReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    runs: int = 0


class Catalog:
    """A catalogue directory (see the module docstring)."""

    def __init__(self, path: str | Path, create: bool = False) -> None:
        self.path = Path(path)
        index = self.path / INDEX_FILE
        if index.is_file():
            self.index = self._read_index(index)
        elif create and (not self.path.exists() or (self.path.is_dir() and not any(self.path.iterdir()))):
            self.index = {"format": FORMAT, "campaigns": {}}
        elif create:
            raise UserError(f"CATALOG {path}: exists and is not a catalogue (no {INDEX_FILE}); accepted: a "
                            "catalogue directory, or a new or empty one")
        else:
            raise UserError(f"CATALOG {path}: not a catalogue (no {INDEX_FILE}); make one with "
                            "`raysweep catalog add CATALOG DIR...`")

    def _read_index(self, index: Path) -> dict[str, Any]:
        import json

        try:
            data = json.loads(index.read_text())
            fmt = int(data["format"])
            if not isinstance(data["campaigns"], dict):
                raise TypeError("campaigns is not a mapping")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"CATALOG {index}: damaged ({type(exc).__name__}: {exc})") from exc
        if fmt > FORMAT:
            raise UserError(f"CATALOG {index}: written in catalogue format {fmt} by a newer raysweep; this one "
                            f"reads format {FORMAT} and older: upgrade raysweep to use it")
        return data

    @property
    def campaigns(self) -> dict[str, dict[str, Any]]:
        return dict(self.index["campaigns"])

    def add(self, dirs: list[str | Path]) -> AddReport:
        """Add (or update) every campaign found under `dirs`; all are read before anything is written. The
        writing holds an exclusive lock on the catalogue's directory and starts from the index as it is then,
        so that two `catalog add` at once each add their campaigns and neither loses the other's.

        :raises UserError: a path holds no campaign, or a file of one cannot be read (nothing written)."""
        found = [f for d in dirs for f in sources.discover(d)]
        report = AddReport()
        known = self.index["campaigns"]
        read: list[sources.Source] = []
        seen: set[str] = set()
        for f in found:
            if f.kind == sources.RAYSWEEP:  # cheap: skip the reading of an unchanged campaign
                sig, _ = sources.raysweep_signature(f.path)
                same = [c for c in known.values() if c["path"] == str(f.path.resolve()) and c["signature"] == sig]
                if same:
                    report.unchanged.append(same[0]["name"])
                    seen.add(same[0]["id"])
                    continue
            src = sources.read(f)
            if src.id not in seen:
                seen.add(src.id)
                read.append(src)
        self.path.mkdir(parents=True, exist_ok=True)
        with _locked(self.path):
            index_file = self.path / INDEX_FILE
            if index_file.is_file():  # another add may have written since this catalogue was opened
                self.index = self._read_index(index_file)
            known = self.index["campaigns"]
            fresh = []
            for src in read:
                old = known.get(src.id)
                if old is not None and old["signature"] == src.signature:
                    report.unchanged.append(src.name)
                else:
                    fresh.append(src)
            now = time.time()
            for src in fresh:
                buf = io.BytesIO()
                src.rows.to_parquet(buf, index=False)
                write_bytes_atomic(self.path / RUNS_DIR / f"{src.id}.parquet", buf.getvalue())
                old = known.get(src.id)
                (report.updated if old else report.added).append(src.name)
                report.runs += len(src.rows)
                known[src.id] = {**_entry(src), "added_at": old["added_at"] if old else now, "updated_at": now}
            if fresh or not index_file.is_file():
                self.index["format"] = FORMAT
                write_json_atomic(index_file, self.index)
        return report

    def entry(self, name: str, option: str = "CAMPAIGN") -> dict[str, Any]:
        """The index entry of the campaign `name` (its id, or its name when one campaign has it).

        :raises UserError: no campaign has that name or id, or several have that name (naming their ids)."""
        known = self.index["campaigns"]
        if name in known:
            return dict(known[name])
        named = [c for c in known.values() if c["name"] == name]
        if len(named) == 1:
            return dict(named[0])
        if named:
            raise UserError(f"{option} {name}: {len(named)} campaigns of the catalogue {self.path} have that name; "
                            f"name one by its id: {', '.join(sorted(c['id'] for c in named))}")
        names = sorted({c["name"] for c in known.values()})
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        raise UserError(f"{option} {name}: no campaign of the catalogue {self.path} has that name or id; "
                        f"its campaigns: {shown or 'none'}")

    def output_dir(self, name: str, option: str = "CAMPAIGN") -> Path:
        """Where the campaign `name` (`entry`) was read from, when it is still there and still that campaign:
        its output dir (or the file or dir another tool wrote), read whole by the faces that need more than the
        catalogue keeps (server starts, confirmation points, the kept answer).

        :raises UserError: not a campaign of the catalogue, or its output is no longer where it was added from
            (or another campaign is there now)."""
        c = self.entry(name, option)
        path = Path(c["path"])
        if not path.exists():
            raise UserError(f"{option} {name}: the campaign {c['name']} ({c['id']}) of the catalogue {self.path} was "
                            f"added from {path}, which is not on this machine; the catalogue keeps its runs, not its "
                            "server starts and confirmation points: copy its output dir here and name the dir, or "
                            f"compare it in the catalogue (`raysweep catalog compare {self.path} ...`)")
        if c["source"] == sources.RAYSWEEP and sources.campaign_id(path) != c["id"]:
            raise UserError(f"{option} {name}: {path}, where the campaign {c['name']} ({c['id']}) of the catalogue "
                            f"{self.path} was added from, now holds another campaign; name the dir itself")
        return path

    def files(self, only: Iterable[str] | None = None) -> list[str]:
        """The Parquet files of the campaigns (of the ids in `only`, when given)."""
        ids = self.index["campaigns"] if only is None else [c for c in only if c in self.index["campaigns"]]
        return [str(self.path / RUNS_DIR / f"{cid}.parquet") for cid in ids]

    def select(self, model: str | None = None, hardware: str | None = None,
               campaign: str | None = None) -> list[str] | None:
        """The ids of the campaigns that can hold runs of `model`, on `hardware`, of `campaign` (its name or
        id), read from the index alone (its entries list each campaign's models and hardware); None when
        nothing is asked (every campaign). A query over them reads only their files."""
        if model is None and hardware is None and campaign is None:
            return None
        return [cid for cid, c in self.index["campaigns"].items()
                if (model is None or model in c["models"]) and (hardware is None or hardware in c["hardware"])
                and (campaign is None or campaign in (cid, c["name"]))]

    def connect(self, only: Iterable[str] | None = None) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with the views `runs` (every run, or the runs of the campaigns in `only`) and
        `campaigns` (the index)."""
        import duckdb
        import pandas as pd

        con = duckdb.connect()
        files = self.files(only)
        if files:
            listing = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
            con.execute(f"CREATE VIEW runs AS SELECT * FROM read_parquet([{listing}])")
        else:
            from raysweep.catalog.fields import empty_frame

            con.register("runs_empty", empty_frame())
            con.execute("CREATE VIEW runs AS SELECT * FROM runs_empty")
        index = pd.DataFrame([{k: (", ".join(map(str, v)) if isinstance(v, list) else v) for k, v in c.items()}
                              for c in self.index["campaigns"].values()])
        con.register("campaigns_df", index if not index.empty else pd.DataFrame({"id": pd.Series([], dtype=str)}))
        con.execute("CREATE VIEW campaigns AS SELECT * FROM campaigns_df")
        return con

    def query(self, sql: str, params: list[Any] | None = None, only: Iterable[str] | None = None) -> pd.DataFrame:
        """The result of a DuckDB query over `runs` (of the campaigns in `only`, when given) and `campaigns`.

        :raises UserError: the query is not valid (DuckDB's message)."""
        import duckdb

        con = self.connect(only)
        try:
            return con.execute(sql, params or []).df()
        except duckdb.Error as exc:
            raise UserError(f"--sql: {exc}") from exc
        finally:
            con.close()


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on the directory itself (no lock file: a catalogue holds only its own files)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _entry(src: sources.Source) -> dict[str, Any]:
    df = src.rows

    def distinct(col: str) -> list[str]:
        return sorted({str(v) for v in df[col].dropna().unique()})

    dates = df["date"].dropna()
    return {"id": src.id, "name": src.name, "source": src.kind, "path": src.path, "signature": src.signature,
            "complete": src.complete, "runs": int(len(df)), "points": int(df["point"].nunique()),
            "models": distinct("model"), "hardware": distinct("hardware"), "vllm": distinct("vllm_version"),
            "first_date": float(dates.min()) if len(dates) else None,
            "last_date": float(dates.max()) if len(dates) else None, "answer": list(src.answer),
            "answer_object": src.answer_object}


def state_of(entry: dict[str, Any]) -> str:
    """What a campaign of the index is: `running` (points pending or running), `complete`, or `ended, no run
    finished` (every point failed: nothing to compare, never "complete")."""
    if not entry.get("complete"):
        return "running"
    return "complete" if int(entry.get("runs") or 0) > 0 else "ended, no run finished"
