"""The optional modes of a campaign, each a package above the stages: tuning (`tune`), SLA search (`sla`), load
levels (`levels`) and offline points (`offline`). Importing this module imports every mode's package, which
registers what the mode adds to the stages (the report's sections); the faces (`cli`, `api`) import it.
"""

from raysweep import levels, offline, sla, tune

__all__ = ["levels", "offline", "sla", "tune"]
