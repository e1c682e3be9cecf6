"""The driver that holds a campaign: acquiring and releasing it, the helpers it started, the drivers that
died without releasing it, and the recovery of what a dead driver left running."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from raysweep.ledger.rows import CampaignHeld, ServerRow, server_row
from raysweep.ledger.store import Store


class DriverLedger(Store):
    """Which driver holds the campaign, and what a lost one left."""

    def live_driver(self, is_alive: Callable[[str, int, float], bool]) -> dict[str, Any] | None:
        """The driver that holds the campaign and still runs (None when none does); reads only."""
        with self._lock:
            rows = self._conn.execute("SELECT * FROM drivers WHERE ended_at IS NULL ORDER BY id DESC").fetchall()
        return next((dict(r) for r in rows if is_alive(r["hostname"], r["pid"], r["pid_create_time"])), None)

    def acquire_driver(self, pid: int, pid_create_time: float, is_alive: Callable[[str, int, float], bool],
                       force: bool = False) -> int:
        """Register this driver; refuse if another live driver holds the campaign.

        `is_alive(hostname, pid, create_time)` says whether an earlier driver still runs.
        """
        host = socket.gethostname()
        with self._tx() as c:
            for row in c.execute("SELECT * FROM drivers WHERE ended_at IS NULL").fetchall():
                if not force and is_alive(row["hostname"], row["pid"], row["pid_create_time"]):
                    raise CampaignHeld(dict(row))
                c.execute("UPDATE drivers SET ended_at = ?, outcome = 'lost' WHERE id = ?", (time.time(), row["id"]))
            cur = c.execute("INSERT INTO drivers(hostname, pid, pid_create_time, started_at) VALUES(?, ?, ?, ?)",
                            (host, pid, pid_create_time, time.time()))
            return int(cur.lastrowid or 0)

    def record_driver_helpers(self, driver_id: int, helpers: list[tuple[int, float]]) -> None:
        """Remember the processes a driver started on its host (its embedded Ray), as (pid, create time),
        so that whoever finds the driver dead can stop them."""
        with self._tx() as c:
            c.execute("UPDATE drivers SET helpers = ? WHERE id = ?", (json.dumps(sorted(helpers)), driver_id))

    def lost_drivers(self) -> list[dict[str, Any]]:
        """Drivers that died without releasing the campaign (killed, crashed, their machine lost)."""
        with self._lock:
            return [dict(r) for r in self._conn.execute("SELECT * FROM drivers WHERE outcome = 'lost'").fetchall()]

    def drivers(self) -> list[dict[str, Any]]:
        """Every driver that held the campaign, oldest first, with its outcome (None while it runs)."""
        with self._lock:
            return [dict(r) for r in self._conn.execute("SELECT * FROM drivers ORDER BY id").fetchall()]

    def last_driver(self) -> dict[str, Any] | None:
        """The most recent driver of this campaign: hostname, pid, start time, end time and outcome."""
        with self._lock:
            row = self._conn.execute("SELECT * FROM drivers ORDER BY id DESC LIMIT 1").fetchone()
        return dict(row) if row else None

    def release_driver(self, driver_id: int, outcome: str) -> None:
        with self._tx() as c:
            c.execute("UPDATE drivers SET ended_at = ?, outcome = ? WHERE id = ?", (time.time(), outcome, driver_id))

    def recover(self) -> tuple[int, list[ServerRow]]:
        """After a driver died: running points go back to pending (the lost attempt is not counted), and the
        servers it left without a stop are returned (marked `lost`) so the caller can reap their processes."""
        with self._tx() as c:
            n = c.execute("UPDATE points SET state = 'pending', attempts = MAX(attempts - 1, 0), updated_at = ? "
                          "WHERE state = 'running'", (time.time(),)).rowcount
            rows = c.execute("SELECT * FROM servers WHERE stopped_at IS NULL").fetchall()
            c.execute("UPDATE servers SET state = 'lost', stopped_at = ? WHERE stopped_at IS NULL", (time.time(),))
        return n, [server_row(r) for r in rows]
