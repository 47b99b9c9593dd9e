"""What a run produces and how it is shown: the records (`records`), their
summary (`metrics`, `session_metrics`), the output files (`output`, `outdir`)
and the HTML report (`report`, `session_report`).

It imports no engine module: reading a results folder needs no simulator.
"""
