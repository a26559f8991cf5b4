"""Trace replay: the placement core driven by the openb trace (or the embedded default)."""
