"""Every server start of the campaign (its record, updated as it starts, runs and stops) and the cluster
events around them (a node lost, a configuration replaced, a tail replica)."""

from __future__ import annotations

import time
from typing import Any

from raysweep.ledger.rows import ServerRow, server_row
from raysweep.ledger.store import Store


class ServerLedger(Store):
    """Servers and cluster events."""

    def add_server(self, server_id: str, serve_id: str, command: str) -> None:
        with self._tx() as c:
            c.execute("INSERT INTO servers(server_id, serve_id, command, started_at, state)"
                      " VALUES(?, ?, ?, ?, 'starting')",
                      (server_id, serve_id, command, time.time()))

    def update_server(self, server_id: str, **fields: Any) -> None:
        allowed = set(ServerRow.__dataclass_fields__) - {"server_id", "serve_id", "started_at"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"unknown server fields: {sorted(bad)}")
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._tx() as c:
            c.execute(f"UPDATE servers SET {cols} WHERE server_id = ?", (*fields.values(), server_id))

    def servers(self, *, active_only: bool = False) -> list[ServerRow]:
        sql = "SELECT * FROM servers" + (" WHERE stopped_at IS NULL" if active_only else "") + " ORDER BY started_at"
        with self._lock:
            return [server_row(r) for r in self._conn.execute(sql).fetchall()]

    def add_event(self, kind: str, serve_ids: list[str], nodes: list[str], detail: str) -> None:
        """A cluster event (`node_lost`, `replaced`, `replica`): when, which configurations, which nodes, what."""
        with self._tx() as c:
            c.execute("INSERT INTO events(at, kind, serve_ids, nodes, detail) VALUES(?, ?, ?, ?, ?)",
                      (time.time(), kind, ",".join(serve_ids), ",".join(nodes), detail))

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._conn.execute("SELECT * FROM events ORDER BY id").fetchall()
        return [{**dict(r), "serve_ids": [x for x in (r["serve_ids"] or "").split(",") if x],
                 "nodes": [x for x in (r["nodes"] or "").split(",") if x]} for r in rows]
