"""dractl: Dynamic Resource Allocation for NVIDIA GPUs on Kubernetes.

Layers, top to bottom (checked by import-linter, see pyproject.toml): `cli` -> modes
(`simulate`, later `controller` and `node`) -> `alloc` (facade over the Cython core
`_alloc`) -> `cel` -> `model` | `config`. Lower layers never import higher ones.
"""

__version__ = "0.1.0"
