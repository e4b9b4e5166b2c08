"""The control-plane operator: level-triggered controllers over the Kubernetes API.

What it does: `claims.ClaimController` is the claim lifecycle controller, speaking the same
protocol as kube-controller-manager's resourceclaim controller, for clusters where that one is
off (it stops writing when it sees the other at work; `run` starts only the scheduler by
default): it creates ResourceClaims from ResourceClaimTemplates for pods and records them in
`pod.status.resourceClaimStatuses` (adopting claims that already exist rather than making a
second one), keeps `status.reservedFor` current (removes pods that are gone or finished, adds
bound pods), deallocates claims carrying the `resource.kubernetes.io/delete-protection`
finalizer once nothing reserves them, and deletes generated claims whose pod is done; a
PodGroup's claims likewise (one per group, recorded in the group's status and by its pods,
reserved for the group, released once it is gone).
`scheduler.Scheduler` is the GPU-aware scheduler for pods with `spec.schedulerName: dractl`: it
picks node and devices together on one long-lived `alloc.Allocator`, writes the claims, binds
the pod, and takes its writes back when one fails; it wires parts that each own their state
(`schedqueue`, `schedfit`, `schedledger`, `scheddecide`, `schedcommit`), its pure decisions are
in `schedplan`, the node filter (kube-scheduler's rules) in `nodefit`. `run` is the `dractl controller` process:
leader election, metrics and health endpoints, graceful shutdown. Each controller follows the
sample-controller loop: informers -> a key-only work queue -> an idempotent sync of one key that
computes the desired state with pure functions and writes only the difference. `loop.Loop` runs
the part they share: it starts the informers and worker threads, requeues a failed key with
backoff, and stops them all.

What it must not do: talk to the API except through `dractl.kube` (client, informers, work
queue, events); import `dractl.node`; write a whole object it read (it patches the fields it
owns with a resourceVersion precondition); deallocate a claim that another component
allocated without the delete-protection finalizer; or retry invalid user input in a hot loop
(that gets a Warning Event).
"""
