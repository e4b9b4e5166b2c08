"""Decode and validate manifests (YAML or JSON) into model values, with the API's defaults applied.

What it does: reads files, directories (recursively: `*.yaml`, `*.yml`, `*.json`, sorted by
path), standard input for the path `-` (named `<stdin>` in messages), multi-document YAML,
JSON and `kind: List` (or any `*List` with `items`), and turns
`resource.k8s.io/v1` DeviceClass, ResourceSlice, ResourceClaim and ResourceClaimTemplate
objects plus core/v1 Pod and Node into `types` values. `v1beta2` has the same shape as `v1`;
`v1beta1` is converted (request fields inline instead of under `exactly`, devices wrapped in
`basic`). Defaults are the API server's: `allocationMode` ExactCount, `count` 1 (also for an
explicit 0; 0 for All), toleration operator Equal, namespace "default", pool generation 0.

Workloads with a pod template are expanded into Pods, as their controllers would create them:
apps/v1 Deployment, ReplicaSet and StatefulSet (`spec.replicas`, default 1) and batch/v1 Job
(`spec.parallelism`, default 1) become Pods named `<name>-0`, `<name>-1`, ... in the
workload's namespace, with the template's labels and pod spec. Every other kind (Service,
ConfigMap, Namespace, ...) is skipped and recorded in `Objects.warnings`, as is legal input
that DRA ignores (`nvidia.com/gpu` device-plugin limits).

Validation follows the API server's rules and limits for creating these objects. Every
problem in every document is collected and raised once as `DecodeError`; each message reads
`<file>: <Kind> <ns>/<name>: <field.path>: <message>`. Patterns from older articles
(`v1alpha2` ResourceClass and claim parameters, `v1alpha3` shapes, v1beta1-style requests in
a v1 object, plain attribute values, constraints with CEL) get a message saying what to
write instead.

Hostile input is bounded before it reaches a recursive parser or an unbounded computation
(see `loading` and `yaml11`): nesting depth, alias expansion, YAML tags, file size, integers
beyond 64 bits and quantities beyond an int64 each get one message naming the file (and the
object and field where there is one).

`load_object(raw, *, source)` decodes ONE parsed API object (as a watch delivers it) into its
model value, or raises `DecodeError` naming the source, object and field, so a caller can skip
one bad object and go on.

The package, one module per concern: `loading` (files, text, JSON, one object), `yaml11`
(YAML as kubectl reads it, with `_fastyaml`, its libyaml fast path in Cython, built by
setup.py), `dispatch` (apiVersion/kind -> decoder), `common` (field helpers, limits, name formats,
metadata), `device_classes`, `resource_claims`, `resource_slices`, `node_selectors`, `pods`,
`seed_hints` ("write instead" messages) and `problems` (results and `DecodeError`); `yaml11_pyyaml`
is `yaml11`'s PyYAML path (anchors, tags, errors), imported only when a document needs it.

What it must not do: compile or evaluate CEL (`dractl.cel` does, one layer up; only empty
and over-long expressions are refused here), check that referenced DeviceClasses exist (the
allocator reports missing classes), talk to an API server, or allocate. Pure apart from
reading the given paths (standard input for `-`).

`read_text(path)`, `documents(text)` and `input_name(path)` are how every reader of a path a user
gives (the trace of `simulate --trace` too) reads it, bounded alike, parses it and names it, so
`-` means standard input alike.

`load_config(path)` reads the one YAML document of a configuration file (a kubeconfig, a fake GPU
profile) as manifests are read, with the same bounds, so every YAML file dractl reads is bounded alike.
"""

from dractl.model.decode.loading import (
    STDIN,
    ConfigError,
    ReadError,
    documents,
    input_name,
    load_config,
    load_documents,
    load_object,
    load_paths,
    load_text,
    read_text,
)
from dractl.model.decode.problems import DecodeError

__all__ = [
    "STDIN",
    "ConfigError",
    "DecodeError",
    "ReadError",
    "documents",
    "input_name",
    "load_config",
    "load_documents",
    "load_object",
    "load_paths",
    "load_text",
    "read_text",
]
