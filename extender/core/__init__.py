"""The placement core: cluster state, the fragmentation measure and placement policies.

Nothing in here talks HTTP or Kubernetes: callers hand in plain data and get a decision back.
"""
