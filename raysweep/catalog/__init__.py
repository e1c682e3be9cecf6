"""The catalogue: every campaign a team ran, and other tools' results, in one place.

A room above `results/` and `report/` and below the faces: it reads campaign directories through
`results/` (the merged table, `vllm bench sweep` import), keeps one row per run with what makes two runs
comparable (`fields`), stores them as a directory of Parquet with a small JSON index (`store`), queried with
DuckDB; `history` follows a configuration and workload over campaigns with the calibrated verdicts of
`maths.verdicts`; `site` writes a static site of it. May import: every
stage and the stage-free rooms; no mode, no face.
"""
