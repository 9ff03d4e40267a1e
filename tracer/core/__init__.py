"""Records, steps, context rendering, files, folds, validation and storage: what every layer builds on.
"""
