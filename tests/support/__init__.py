"""Helpers shared by the tests, importable as `support` (`pythonpath = ["tests"]` in pyproject.toml).

What lives here: builders of model values (`devices`), manifests written as test input
(`model_manifests`, `simulate_manifests`), allocator inputs (`alloc_inputs`), node state
inputs (`state_inputs`), the claim controller's and the scheduler's inputs (`controller_inputs`,
`scheduler_inputs`), an in-memory cluster for `dractl explain` (`explain_api`), API objects for the
tests against a real API server (`kube_objects`), one test's nodes with GPUs and the pods that land
on them (`node_group`), a kube client with scripted answers (`scripted_client`), the kubelet's side of
a node agent (`kubelet`: settings on short socket paths, prepare and unprepare over the DRA socket),
`dractl node-agent` run as processes (`agent_process`), what a process serves and logs (`observe`:
GET of its HTTP endpoints, its JSON log lines), the Helm chart rendered (`chart`), Debian packages
installed when missing (`debian`), the CDI rules (`cdi_rules`), the brute-force oracle (`oracle`)
and the hypothesis strategies (`strategies`). What must not: fixtures (they stay in the
conftest.py of the directory that uses them) and anything the package under test imports.
"""
