"""Hands pods the extender admitted to a Ray runtime as fault-tolerant PyTorch trainer actors.

Not built yet: see issue "raybridge: admitted pods become fault-tolerant PyTorch trainer actors on Ray".
"""
