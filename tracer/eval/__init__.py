"""Teacher-forcing and free-running evaluation: the runner, metrics, outputs, reports and plots.
"""
