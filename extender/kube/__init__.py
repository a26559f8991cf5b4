"""The Kubernetes side of the extender: the object contract, the cache fed by the API, binding.

`contract` is pure (dicts in, core types out); the rest are thin shells around the core.
"""
