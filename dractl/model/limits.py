"""Limits of the `resource.k8s.io/v1` API that more than one layer enforces, defined once.

What it does: names the numbers the API server's validation and the allocator share. What it
must not do: hold settings (those live in `dractl.config`) or anything computed.
"""

MAX_RESULTS = 32
"""Devices allocated per claim (`AllocationResultsMaxSize`); also the most a claim may request."""

MAX_RESERVED_FOR = 256
"""Consumers in a claim's `status.reservedFor` (`ResourceClaimReservedForMaxSize`)."""
