"""What a campaign keeps on disk beside its ledger (`raysweep.ledger`): whole-or-nothing files, mirroring an
output directory to a filesystem URI, settings drift between a campaign's points and a resume, the names
of the server-side fields a result record carries (`fields`), the records a run wrote (`runs`), and a
campaign's directory as one object (`directory`: `CampaignDir`, its ledger opened once), which the stages
above take instead of a path.

May import: the stage-free rooms and `ledger`. Knows nothing of Ray, HTTP, the campaign file or the plan.
"""
