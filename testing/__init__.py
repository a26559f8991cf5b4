"""What the tests and the benches share: a live extender to fuzz, synthetic clusters, a local control plane,
headless chromium. Installed beside the packages by `pip install -e .` (setup.cfg) so that `bench/*.py` import it
as they import `extender`, never through sys.path; the image does not ship it (the Dockerfile copies only the
packages it runs). It imports nothing of `tests`, and nothing under extender/, gpu_sharing/, raybridge/ or
tessera_contract/ imports it (tests/test_import_graph.py)."""
