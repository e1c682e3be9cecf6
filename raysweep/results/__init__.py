"""Results: the merged table of a campaign's runs, per-point statistics and verdicts, conclusions, compare,
import of other tools' results, and the acceptance summary.

May import: every earlier stage and the stage-free rooms. Knows nothing of plots, the report or the CLI.
"""
