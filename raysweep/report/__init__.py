"""The report: figures (`report.plots`), the HTML page and its sections (registered in `report.registry`, not
loaded by name), export to an experiment tracker and live tracking. Reading never writes a result.

May import: every earlier stage and the stage-free rooms. Knows nothing of Ray.
"""
