"""Fault-tolerant PyTorch training for Ray jobs that Tessera admits, each in its own Ray cluster.

job.py (the job's driver and member pods, under the job's identity) runs the job's Ray cluster and
its controller; bridge.py (privileged, Kubernetes only) replaces lost pods, started by `tessera bridge` (cli.py).
docs/raybridge.md.
"""
