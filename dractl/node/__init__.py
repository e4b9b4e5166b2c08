"""The node agent layer: what runs on each GPU node (kubelet DRA plugin for `gpu.nvidia.com`).

What it does: discovers the node's GPUs through a `backend.NvmlBackend` (the real NVML in
`nvml`, or the deterministic fake in `fakegpu`), turns them into the ResourceSlices the
node publishes (`inventory`, `slices`, `discover`), and prepares and unprepares claims
(plugin, state, CDI, MIG, sharing, health).

What it must not do: import `dractl.controller`, talk to the Kubernetes API except through
`dractl.kube`, import `pynvml` anywhere but `nvml`, import `grpc` anywhere but the plugin
modules, or allocate devices (the scheduler allocates; the node only carries out what a
claim's allocation says).
"""
