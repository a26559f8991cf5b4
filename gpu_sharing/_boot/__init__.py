"""Put on a Python child's PYTHONPATH by tessera-launch: its sitecustomize caps PyTorch's memory to the slice.

Self-contained on purpose: the child may run another interpreter or venv, without Tessera installed.
"""
