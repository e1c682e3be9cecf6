"""What a campaign keeps on disk beside its ledger (`raysweep.ledger`): whole-or-nothing files, mirroring an
output directory to a filesystem URI, and settings drift between a campaign's points and a resume.

May import: the stage-free rooms, `campaign`, `plan` and `ledger`. Knows nothing of Ray or HTTP.
"""
