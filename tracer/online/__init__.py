"""Learning while serving: adding logged trajectories and tools to a fitted scorer, drift, transfer.
"""
