"""The exact optimum a placement benchmark measures against: the most claims of a fill trace that
any allocator could admit before its first rejection, from an integer program (PuLP with CBC,
`pip install -e '.[bench]'`).

Independent of dractl's allocator: devices are read from the trace's ResourceSlices, a request's
candidates are the devices its DeviceClass's and its own CEL selectors accept (evaluated with
`dractl.cel` directly), and every way of placing a claim on one node is enumerated with its
`matchAttribute` constraints. The program then chooses at most one placement per claim:

- `admit[i]` is 1 when claim i is placed; `admit[i] >= admit[i + 1]`, so the admitted claims are
  a prefix of the stream, and the objective is their number;
- a device is used by at most one placement (the mixes have no multi-allocatable devices);
- the counters a pool publishes (`sharedCounters`) are never over-consumed: a full GPU in
  dynamic MIG mode and its MIG placements consume one counter set, so they exclude each other
  exactly as they do in the API.

Only request shapes of the benchmark mixes are supported: `exactly` requests in ExactCount mode,
`matchAttribute` constraints, devices of node-local slices. Anything else raises ValueError.

`cached` keeps each result in `$XDG_CACHE_HOME/dractl/optimum/` (default `~/.cache/dractl/optimum/`),
one JSON file named by a hash of the trace document and the program's version, so a rerun of the
benchmark solves nothing it solved before. Delete the directory to solve again.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
from collections.abc import Iterator, Mapping, Sequence

from dractl import cel, model
from dractl.model import nodes as model_nodes
from dractl.simulate import trace

_MAX_OPTIONS = 50_000  # placements of one claim: past this the enumeration is not meant for it
# Part of every cache key: change it when the program changes what it computes.
_VERSION = "optimum-1"


@dataclasses.dataclass(frozen=True, slots=True)
class _Device:
    node: str
    key: tuple[str, str, str]  # driver, pool, device
    device: model.Device
    consumes: Mapping[tuple[str, str, str, str], int]  # (driver, pool, counter set, counter) -> amount
    entry: cel.program.DeviceInput


@dataclasses.dataclass(frozen=True, slots=True)
class Optimum:
    """The optimum's value when `proven`, else the best placement found (`value`) and the solver's
    upper bound on it (`bound`) when the time limit ended the search first."""

    value: int
    bound: int
    proven: bool
    claims: int  # claims of the stream the program considered (the rest cannot fit anyway)
    nodes: Mapping[str, str]  # claim name -> the node of its placement in the solution found


def optimum(tr: trace.Trace, *, time_limit: float = 300.0) -> Optimum:
    """Solve the program for the trace's arrivals (claims only, in replay order). Pure but for
    the solver's own temporary files; deterministic for a given trace (CBC with one thread)."""
    import pulp  # the benchmark extra; imported here so that importing this module needs nothing

    devices, capacity = _inventory(tr.cluster)
    classes = {c.meta.name: c for c in tr.cluster.device_classes}
    claims = [a.object for a in trace.arrivals(tr) if isinstance(a.object, model.ResourceClaim)]
    claims = claims[: _most_that_fit(claims, devices, classes) + 1]
    problem = pulp.LpProblem("admitted_before_first_rejection", pulp.LpMaximize)
    admit = [pulp.LpVariable(f"admit_{i}", cat="Binary") for i in range(len(claims))]
    problem += pulp.lpSum(admit)
    for i in range(1, len(admit)):
        problem += admit[i] <= admit[i - 1]
    uses: dict[tuple[str, str, str], list[pulp.LpVariable]] = collections.defaultdict(list)
    consumed: dict[tuple[str, str, str, str], list[tuple[int, pulp.LpVariable]]] = collections.defaultdict(list)
    where: list[tuple[str, str, pulp.LpVariable]] = []
    for i, claim in enumerate(claims):
        chosen = []
        for j, option in enumerate(_options(claim, devices, classes)):
            y = pulp.LpVariable(f"place_{i}_{j}", cat="Binary")
            chosen.append(y)
            where.append((claim.meta.name, option[0].node, y))
            for d in option:
                uses[d.key].append(y)
                for counter, amount in d.consumes.items():
                    consumed[counter].append((amount, y))
        problem += pulp.lpSum(chosen) == admit[i]
    for ys in uses.values():
        if len(ys) > 1:
            problem += pulp.lpSum(ys) <= 1
    for counter, terms in consumed.items():
        if sum(a for a, _ in terms) > capacity[counter]:
            problem += pulp.lpSum(a * y for a, y in terms) <= capacity[counter]
    status = problem.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, threads=1))
    value = round(pulp.value(problem.objective) or 0)
    proven = pulp.LpStatus[status] == "Optimal" and problem.sol_status == pulp.LpSolutionOptimal
    bound = value if proven else len(claims)
    nodes = {name: node for name, node, y in where if (y.value() or 0) > 0.5}
    return Optimum(value=value, bound=bound, proven=proven, claims=len(claims), nodes=nodes)


def cache_dir() -> pathlib.Path:
    """`$XDG_CACHE_HOME/dractl/optimum`, else `~/.cache/dractl/optimum`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(base) / "dractl" / "optimum"


def cached(tr: trace.Trace, *, time_limit: float = 300.0) -> Optimum:
    """`optimum(tr)`, read from the cache when this trace was solved before with at least this
    time limit (or proven), else solved and written there (a temporary name, then a rename, so
    concurrent runs never read half a file). A cache file that does not parse is solved again."""
    text = json.dumps(tr.document, sort_keys=True, separators=(",", ":"), default=str)
    key = hashlib.sha256(f"{_VERSION}\n{text}".encode()).hexdigest()[:32]
    path = cache_dir() / f"{key}.json"
    try:
        found = json.loads(path.read_text())
        result = Optimum(
            value=int(found["value"]),
            bound=int(found["bound"]),
            proven=bool(found["proven"]),
            claims=int(found["claims"]),
            nodes={str(k): str(v) for k, v in found["nodes"].items()},
        )
        if result.proven or float(found["time_limit"]) >= time_limit:
            return result
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    result = optimum(tr, time_limit=time_limit)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({**dataclasses.asdict(result), "time_limit": time_limit}, sort_keys=True))
    temporary.replace(path)
    return result


def _inventory(cluster: model.Objects) -> tuple[list[_Device], dict[tuple[str, str, str, str], int]]:
    """Every device of the usable pools with its node and counter consumption, and every
    counter's capacity."""
    devices: list[_Device] = []
    capacity: dict[tuple[str, str, str, str], int] = {}
    for usable in model_nodes.Pools(cluster.resource_slices).current().usable:
        pool = usable.pool
        if pool.problem is not None:
            continue
        for s in pool.slices:
            for counter_set in s.shared_counters:
                for name, value in counter_set.counters.items():
                    capacity[(pool.driver, pool.name, counter_set.name, name)] = value.as_int()
        for s in pool.slices:
            for device in s.devices:
                node = device.node_name or s.node_name
                if node is None:
                    raise ValueError(f"pool {pool.name}: device {device.name} is not node-local")
                consumes = {
                    (pool.driver, pool.name, use.counter_set, name): amount.as_int()
                    for use in device.consumes_counters
                    for name, amount in use.counters.items()
                }
                entry = cel.program.device_input(pool.driver, device)
                devices.append(_Device(node, (pool.driver, pool.name, device.name), device, consumes, entry))
    return devices, capacity


def _candidates(
    request: model.ExactDeviceRequest, devices: Sequence[_Device], classes: Mapping[str, model.DeviceClass]
) -> list[_Device]:
    found = classes.get(request.device_class_name)
    if found is None:
        raise ValueError(f"device class {request.device_class_name} is not in the trace")
    programs = [cel.program.compile(e) for e in (*found.selectors, *request.selectors)]
    return [d for d in devices if all(p.matches(d.entry) for p in programs)]


def _requests(claim: model.ResourceClaim) -> list[tuple[str, model.ExactDeviceRequest]]:
    out = []
    for request in claim.spec.requests:
        exactly = request.exactly
        if exactly is None or exactly.allocation_mode is not model.AllocationMode.EXACT_COUNT:
            raise ValueError(f"claim {claim.key}: request {request.name}: only exactly/ExactCount is supported")
        out.append((request.name, exactly))
    return out


def _options(
    claim: model.ResourceClaim, devices: Sequence[_Device], classes: Mapping[str, model.DeviceClass]
) -> Iterator[tuple[_Device, ...]]:
    """Every placement of the claim on one node: distinct devices, each request's count of its
    candidates, every matchAttribute constraint met. Placements that differ only in the order of
    a request's devices are one."""
    requests = _requests(claim)
    candidates = {name: _candidates(r, devices, classes) for name, r in requests}
    matches: list[tuple[frozenset[str], str]] = []
    for c in claim.spec.constraints:
        if c.distinct_attribute is not None:
            raise ValueError(f"claim {claim.key}: distinctAttribute is not supported")
        if c.match_attribute is not None:
            matches.append((frozenset(c.requests or candidates), c.match_attribute))
    count = 0
    nodes = sorted({d.node for ds in candidates.values() for d in ds})
    for node in nodes:
        on_node = {name: [d for d in ds if d.node == node] for name, ds in candidates.items()}
        for option in _combine(requests, on_node, matches, claim):
            count += 1
            if count > _MAX_OPTIONS:
                raise ValueError(f"claim {claim.key}: more than {_MAX_OPTIONS} placements")
            yield option


def _combine(
    requests: Sequence[tuple[str, model.ExactDeviceRequest]],
    candidates: Mapping[str, list[_Device]],
    matches: Sequence[tuple[frozenset[str], str]],
    claim: model.ResourceClaim,
) -> Iterator[tuple[_Device, ...]]:
    """Placements on one node, grouped by the value of every matched attribute first so that
    only devices that can satisfy the constraints together are combined."""

    def value(d: _Device, attribute: str) -> object:
        domain, _, name = attribute.rpartition("/")
        found = d.device.attributes.get(name) if domain == d.key[0] else d.device.attributes.get(attribute)
        if found is None:
            found = d.device.attributes.get(attribute)
        return None if found is None else (found.values, found.is_list)

    def extend(index: int, taken: tuple[_Device, ...], fixed: Mapping[str, object]) -> Iterator[tuple[_Device, ...]]:
        if index == len(requests):
            yield taken
            return
        name, request = requests[index]
        constrained = [attribute for names, attribute in matches if name in names]
        pool = [d for d in candidates[name] if d not in taken]
        for attribute in constrained:
            if attribute in fixed:
                pool = [d for d in pool if value(d, attribute) == fixed[attribute]]
            else:
                pool = [d for d in pool if value(d, attribute) is not None]
        if any(value(d, a) is not None and value(d, a)[1] for d in pool for a in constrained):  # type: ignore[index]
            raise ValueError(f"claim {claim.key}: matchAttribute over list attributes is not supported")
        for combo in itertools.combinations(pool, request.count):
            values = {a: value(combo[0], a) for a in constrained}
            if any(value(d, a) != values[a] for d in combo for a in constrained):
                continue
            yield from extend(index + 1, taken + combo, {**fixed, **values})

    yield from extend(0, (), {})


def _most_that_fit(claims: Sequence[model.ResourceClaim], devices: Sequence[_Device], classes) -> int:
    """An upper bound on the prefix any allocator admits: the first k claims together ask for at
    most as many GPUs as the cluster has, a MIG device counting as its share of its GPU's memory
    slices (the `memory` counter of its counter set)."""
    per_set: dict[tuple[str, str, str], int] = {}
    for d in devices:
        for (driver, pool, counter_set, name), amount in d.consumes.items():
            if name == "memory":
                key = (driver, pool, counter_set)
                per_set[key] = max(per_set.get(key, 0), amount)
    gpus = sum(1 for d in devices if _type(d) == "gpu")
    share_cache: dict[str, float] = {}
    used = 0.0
    for k, claim in enumerate(claims):
        for _, request in _requests(claim):
            key = request.device_class_name + "|" + "|".join(request.selectors)
            if key not in share_cache:
                shares = []
                for d in _candidates(request, devices, classes):
                    memory = [(c, a) for c, a in d.consumes.items() if c[3] == "memory"]
                    shares.append(min((a / per_set[c[:3]] for c, a in memory), default=1.0))
                share_cache[key] = min(shares, default=float("inf"))
            used += share_cache[key] * request.count
        if used > gpus + 1e-9:
            return k
    return len(claims)


def _type(d: _Device) -> str:
    found = d.device.attributes.get("type") or d.device.attributes.get(f"{d.key[0]}/type")
    return "" if found is None else str(found.values[0])
