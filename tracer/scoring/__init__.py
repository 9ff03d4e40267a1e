"""The one interface every tool selector shares, its output records, ranking and presentation of k tools.
"""
