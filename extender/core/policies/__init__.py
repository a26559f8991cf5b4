"""The built-in policies; importing this package registers them by name."""

from . import baselines, fgd, k8s_default, tessera  # noqa: F401
