"""Results: the merged table of a campaign's runs, per-point statistics and verdicts, conclusions, compare,
import of other tools' results, the acceptance summary, and where a campaign stands (`status`). The readers of
a campaign take its directory (`raysweep.record.directory.CampaignDir`); those that also read other tools'
folders and files (`importer.read_table`, `compare.load_side`) take a path too.

May import: every earlier stage and the stage-free rooms. Knows nothing of plots, the report or the CLI.
"""
