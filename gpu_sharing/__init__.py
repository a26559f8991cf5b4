"""The GPU side of a node: NVML inventory, published to Kubernetes, and slices enforced in the container.

Not built yet: see issue "gpu_sharing: the node agent (NVML) ...".
"""
