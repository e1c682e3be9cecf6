"""The campaign in the ledger: its stored file, name, fingerprint and meaning, and the sync of its plan's
points (new points pending, finished points kept, a changed meaning refused)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from raysweep.errors import LedgerError
from raysweep.ledger.rows import SyncReport
from raysweep.ledger.store import SCHEMA_VERSION, PointTuple, Store, insert_points


class CampaignLedger(Store):
    """The campaign's record and its plan."""

    def meta(self, key: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row["value"] if row else None

    def set_meta(self, key: str, value: str) -> None:
        """Keep one value of the campaign's record (e.g. `measured_with`, raysweep.record.drift)."""
        with self._tx() as c:
            c.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                      (key, value))

    def stored_campaign(self) -> dict[str, Any]:
        text = self.meta("campaign")
        if text is None:
            raise LedgerError(f"{self.path}: the ledger holds no campaign")
        return json.loads(text)

    def sync(self, *, name: str, fingerprint: str, meaning: dict[str, Any], campaign: dict[str, Any],
             campaign_file: str, points: list[PointTuple],
             force: bool = False, searches: Sequence[tuple[str, str]] = ()) -> SyncReport:
        """Record the campaign and its points: new points become pending, finished ones are kept.
        The probes of SLA searches (serve id, bench id) still in the plan stay in it.

        Refuses (unless `force`) when the stored campaign has another name or another fingerprint.
        """
        old_name, old_fp = self.meta("name"), self.meta("fingerprint")
        changed = old_fp is not None and old_fp != fingerprint
        if not force:
            if old_name is not None and old_name != name:
                raise LedgerError(f"{self.path.parent} holds campaign {old_name!r}, not {name!r}; "
                                  "use another output_dir, or --force to take it over")
            if changed:
                old = json.loads(self.meta("meaning") or "{}")
                diff = sorted(k for k in set(old) | set(meaning) if old.get(k) != meaning.get(k))
                raise LedgerError(f"the campaign changed in a way that changes the meaning of finished points "
                                  f"({', '.join(diff)} differ from the ledger); finished results would no longer "
                                  "match it. Use another output_dir, or --force to keep them anyway")
        now = time.time()
        with self._tx() as c:
            for key, value in (("name", name), ("fingerprint", fingerprint), ("meaning", json.dumps(meaning)),
                               ("campaign", json.dumps(campaign)), ("campaign_file", campaign_file),
                               ("schema_version", SCHEMA_VERSION)):
                c.execute("INSERT INTO meta(key, value) VALUES(?, ?)"
                          " ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))
            c.execute("INSERT OR IGNORE INTO meta(key, value) VALUES('created_at', ?)", (str(now),))
            before = c.execute("SELECT COUNT(*) FROM points").fetchone()[0]
            insert_points(c, points)
            added = c.execute("SELECT COUNT(*) FROM points").fetchone()[0] - before
            c.execute("UPDATE points SET in_plan = 0")
            c.executemany("UPDATE points SET in_plan = 1 WHERE point_id = ?", [(p[0],) for p in points])
            c.executemany("UPDATE points SET in_plan = 1 WHERE serve_id = ? AND probe_of = ?", list(searches))
            out = c.execute("SELECT COUNT(*) FROM points WHERE in_plan = 0").fetchone()[0]
        return SyncReport(added=added, in_plan=len(points), out_of_plan=out, fingerprint_changed=changed)
