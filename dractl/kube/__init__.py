"""The Kubernetes layer: the only place in dractl that talks to the API server.

What it does: builds a client from a kubeconfig or the in-cluster service account on the
official `kubernetes` package (config, auth, transport only), sends raw JSON requests and
decodes responses into `dractl.model` values one object at a time (`client`, which retries
only what is safe and paces requests with a token bucket, `ratelimit`); keeps caches fed by
list+watch (`informer`); queues keys for level-triggered workers (`workqueue`); records
Events (`events`); elects a leader through a Lease and fences the leader's writes on it
(`leader`); adds and removes finalizers without re-encoding the rest of an object
(`finalizers`); reads claims for the node agent (`claims`); and says which API calls each
component makes, the table the chart's RBAC is generated from (`access`).

What it must not do: import `dractl.alloc`, `dractl.node`, `dractl.controller` or the CLI;
use the `kubernetes` package's generated models (their decoding is slow and drops unknown
fields); write back a whole object it read through a model (patch the fields dractl owns,
with a resourceVersion precondition where it matters); or decide anything: what to write
is the caller's business. `kubernetes` and `urllib3` are imported nowhere else in dractl.
"""
