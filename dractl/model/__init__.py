"""The model layer: `resource.k8s.io/v1` values with the API's defaults applied.

What it does: defines the value types (`types`), quantities and versions, and decodes and
validates manifests into values (`decode`) and encodes values back into the API's shape
(`encode`). What it must not do: talk to an API server, evaluate CEL, or allocate.
Everything here is pure and importable from any layer.

Use it as `from dractl import model` and then `model.ResourceClaim`, `model.quantity.parse`.
"""

from dractl.model import limits, quantity, semver, types
from dractl.model.types import *  # noqa: F403  (the types are the package's vocabulary)

__all__ = ["limits", "quantity", "semver", *types.__all__]  # noqa: F405
