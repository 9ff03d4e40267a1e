"""The structures learned from trajectories: the execution trie with its edge memories, and transition counts.
"""
