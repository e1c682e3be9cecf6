"""The JSON Schemas of raysweep's JSON output (`--json` of each command), as data files; no code to import.

May import: nothing.
"""
