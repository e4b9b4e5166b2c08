"""Helpers shared by the tests, importable as `support` (`pythonpath = ["tests"]` in pyproject.toml).

What lives here: builders of model values (`devices`), manifests written as test input
(`model_manifests`, `simulate_manifests`), allocator inputs (`alloc_inputs`), node state
inputs (`state_inputs`), API objects for the tests against a real API server
(`kube_objects`), one test's nodes with GPUs and the pods that land on them (`node_group`),
the CDI rules (`cdi_rules`), the brute-force oracle (`oracle`) and the hypothesis strategies
(`strategies`). What must not: fixtures (they stay in the conftest.py of the directory that
uses them) and anything the package under test imports.
"""
