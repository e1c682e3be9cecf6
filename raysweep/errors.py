"""Error types shared by the parts: user errors (exit 2, nothing started) and run-time failures."""

from __future__ import annotations

__all__ = ["UserError", "CampaignError", "LedgerError"]


class UserError(Exception):
    """Bad input from the user. The CLI prints it and exits with code 2; nothing has been started."""

    exit_code = 2


class CampaignError(UserError):
    """An invalid campaign file. `field` is the path of the faulty field, e.g. `serve.params.grid`."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class LedgerError(UserError):
    """The output directory's ledger refuses the operation (fingerprint mismatch, another driver, ...)."""
