"""Results: the merged table of a campaign's runs, per-point statistics and verdicts, conclusions, compare,
import of other tools' results, the acceptance summary, and where a campaign stands (`status`). Each reader
of a campaign takes its directory (`raysweep.record.directory.CampaignDir`), never a path.

May import: every earlier stage and the stage-free rooms. Knows nothing of plots, the report or the CLI.
"""
