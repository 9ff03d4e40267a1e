"""Jobs that the entry scripts run: ``train`` (``train.py``: fit the deployed scorer, save the index, report
it), ``train_summary`` (its report.md) and ``evaluate`` (``evaluate.py``: build the run from its config and
run the regime it names, :mod:`tracer.eval` holding the regimes, metrics and reports). The blend head's own
report is :mod:`tracer.learn.blend_report`."""
