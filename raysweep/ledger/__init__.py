"""The durable ledger: one SQLite database (WAL) in the output directory.

It holds the campaign (as stored, secrets masked) and its fingerprint, every point with its state
(pending / running / done / failed), attempts, times, error and server-log tail and result file, every
server start, and which driver holds the campaign. Only a driver writes; `status` and `results` read.

The rooms: `store` (tables, added columns, the connection), `rows` (what readers get back), `campaign`
(the stored campaign and the sync of its plan), `drivers` (who holds it, recovery), `points` (their states
and moves), `servers` (server starts, cluster events), `decisions` (SLA searches, precision, load levels,
tuning candidates).

May import: the stage-free rooms only. Knows nothing of Ray or HTTP.
"""

from __future__ import annotations

from raysweep.ledger.campaign import CampaignLedger
from raysweep.ledger.decisions import DecisionLedger
from raysweep.ledger.drivers import DriverLedger
from raysweep.ledger.points import PointLedger
from raysweep.ledger.rows import CampaignHeld, PointRow, PointState, ServerRow, SyncReport
from raysweep.ledger.servers import ServerLedger
from raysweep.ledger.store import LEDGER_FILE

__all__ = ["CampaignHeld", "Ledger", "PointRow", "PointState", "ServerRow", "SyncReport", "LEDGER_FILE"]


class Ledger(CampaignLedger, DriverLedger, PointLedger, ServerLedger, DecisionLedger):
    """The SQLite ledger of one output directory. Thread-safe; every write is one transaction."""
