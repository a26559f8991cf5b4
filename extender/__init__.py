"""Tessera's scheduler extender: the pure placement core and the trace simulator.

`extender.core` decides where a pod goes (plain data in, a decision out);
`extender.sim` replays traces through it. The HTTP shell comes later and stays thin.
"""
