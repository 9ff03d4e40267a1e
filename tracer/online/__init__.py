"""Learning while serving: adding logged trajectories and tools to a fitted scorer, drift, transfer.

``updater`` (:class:`~tracer.online.updater.Updater`: tries updated at once, learned weights refitted on a
schedule), ``incremental`` (what an update does to a fitted scorer, equal to a rebuild on the union),
``transfer`` (a candidate model for a dataset with few or no logs).
"""
