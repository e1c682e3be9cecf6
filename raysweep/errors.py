"""Error types shared by the parts: user errors (exit 2, nothing started) and run-time failures."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["UserError", "CampaignError", "LedgerError", "RayStartError", "unknown_names"]


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


class RayStartError(UserError):
    """Ray did not start (the embedded local one) or could not be joined (`--address`): the CLI prints the
    message, which says what to try, without a traceback, and exits with code 3. No point was run."""

    exit_code = 3


def unknown_names(option: str, missing: Sequence[str], accepted: Sequence[str], what: str = "column",
                  limit: int = 8) -> str:
    """The message for names that are not among `accepted`: the closest candidates (did you mean ...?),
    or every accepted name when there are at most `limit`, never a list longer than that."""
    import difflib

    accepted = list(dict.fromkeys(accepted))
    close: list[str] = []
    for name in missing:
        low = name.lower()
        close += difflib.get_close_matches(name, accepted, n=3, cutoff=0.6)
        close += [a for a in accepted if min(len(low), len(a)) >= 4 and (low in a.lower() or a.lower() in low)][:3]
    close = list(dict.fromkeys(close))[:limit]
    head = f"{option} {','.join(missing)}: no such {what}"
    guess = f"; did you mean {', '.join(close)}?" if close else ""
    if len(accepted) <= limit:
        return f"{head}{guess}{' (' if guess else '; '}accepted: {', '.join(accepted) or 'none'}{')' if guess else ''}"
    if close:
        return f"{head}{guess} ({len(accepted)} {what}s accepted)"
    return f"{head} ({len(accepted)} {what}s accepted, e.g. {', '.join(accepted[:limit])})"
