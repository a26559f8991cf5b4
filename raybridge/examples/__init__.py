"""Example training entrypoints for the Ray bridge (CPU-friendly, synthetic data)."""
