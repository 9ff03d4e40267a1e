"""Jobs that the entry scripts run: ``train`` (``train.py``: fit the deployed scorer, save the index, report
it) and ``train_summary`` (its report.md). The blend head's own report is :mod:`tracer.learn.blend_report`;
``evaluate.py``'s job is :mod:`tracer.eval.job`."""
