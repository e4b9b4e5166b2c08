"""A static bound on what evaluating a selector can allocate and how long it can run.

What it does: `estimate(root, bounds)` walks the checked AST and computes, for every node, an
upper bound on the size of its value (bytes of a string; for a list or map the sizes of its
elements plus one per element; 1 for a scalar) and on the work to compute it (one unit per
node, plus the bytes each operation reads or writes). Input values are bounded by `Bounds`:
by default the API's validation limits for a device (32 attributes and capacities, 48 values,
64-character strings, 63-character domains), so one estimate per expression covers every
validated device; a device beyond them gets its own estimate at run time.

Why: cel-expr-python 0.1.3 has no cost limit. It bounds comprehension iterations (10,000 per
evaluation), but nothing bounds the size of values, and `cel.bind(s, s + s, ...)` nested a few
dozen times, `replace` with a long replacement, or `map` over lists built by `map` grow
exponentially. Kubernetes refuses such selectors by their estimated cost (`CELSelectorExpressionMaxCost`,
1,000,000 units) and stops them at run time; here the estimate alone decides, in bytes.

What it must not do: under-estimate. Every rule over-approximates; functions without a rule of
their own are bounded by the sum of their inputs, which holds for every function of this
environment that is not listed (`substring`, `lowerAscii`, `trim`, `orValue`, `dyn`, quantity
arithmetic ...). An estimate that would take too long to compute is itself a refusal.
"""

from __future__ import annotations

import dataclasses
import functools

from dractl.cel import checked

MAX_VALUE_BYTES = 1 << 20
"""The largest value an evaluation may build (1 MiB)."""

MAX_COST = 10_000_000
"""The most work an evaluation may do, in bytes touched (about 10 ms of the library's time)."""

ITERATIONS = 10_000
"""cel-expr-python's comprehension iteration budget per evaluation (measured: 9,900 pass, 10,100 fail)."""

_MAX_VISITS = 200_000
_PROBE = 1 << 30  # an accumulator size far above any real one, to see how a loop step grows


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Bounds:
    """Upper bounds on the inputs: the driver name, one attribute or capacity value, and a
    whole `device.attributes` / `device.capacity` map (any domain of it, too)."""

    driver: int = 63
    attribute_value: int = 48 * 65
    attributes: int = 32 * 33 + 48 * 65 + 32 * 64
    capacity_value: int = 64
    capacity: int = 32 * (33 + 64) + 32 * 64
    entries: int = 32
    values: int = 48
    key: int = 63  # a domain, or an attribute or capacity identifier
    string: int = 64  # one string of a list-type attribute

    def covers(self, other: Bounds) -> bool:
        """Whether every bound here is at least the other's."""
        return all(getattr(self, f.name) >= getattr(other, f.name) for f in dataclasses.fields(self))

    def widened(self, other: Bounds) -> Bounds:
        """The field-wise maximum."""
        return Bounds(*(max(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self)))


DEFAULT = Bounds()
"""What the API's validation guarantees for every device (k8s resource.k8s.io/v1 limits)."""


class TooCostly(ValueError):
    """The expression may build values or do work beyond the limits."""


@dataclasses.dataclass(frozen=True, slots=True)
class Estimate:
    size: int  # the largest value of the whole expression or any part of it
    cost: int


def check(root: checked.Node, bounds: Bounds = DEFAULT) -> Estimate:
    """The estimate of an expression, or `TooCostly` with a message saying why. Pure."""
    walker = _Walker(bounds)
    size, cost = walker.node(root, {})
    if walker.largest > MAX_VALUE_BYTES:
        raise TooCostly(
            f"it may build a value of up to {_amount(walker.largest)} bytes (estimated), "
            f"over the limit of {_amount(MAX_VALUE_BYTES)}; avoid doubling strings or lists "
            "(s + s in cel.bind, replace() with long text, map() over lists built by map())"
        )
    if cost > MAX_COST:
        raise TooCostly(
            f"its estimated cost is {_amount(cost)}, over the limit of {_amount(MAX_COST)}; "
            "nested comprehensions over long lists or strings multiply their cost"
        )
    return Estimate(size=max(size, walker.largest), cost=cost)


@functools.lru_cache(maxsize=4096)
def cached(root: checked.Node, bounds: Bounds) -> Estimate | str:
    """`check`, cached, with the refusal as its message. Pure."""
    try:
        return check(root, bounds)
    except TooCostly as refusal:
        return str(refusal)


def _amount(n: int) -> str:
    return f"{n:,}" if n < 10**15 else f"about 10^{len(str(n)) - 1}"


_SCALAR_RESULTS = frozenset(
    {
        "_==_",
        "_!=_",
        "_<_",
        "_<=_",
        "_>_",
        "_>=_",
        "_&&_",
        "_||_",
        "!_",
        "@in",
        "-_",
        "_-_",
        "_*_",
        "_/_",
        "_%_",
        "@not_strictly_false",
        "size",
        "contains",
        "startsWith",
        "endsWith",
        "matches",
        "indexOf",
        "lastIndexOf",
        "int",
        "uint",
        "double",
        "bool",
        "type",
        "compareTo",
        "isGreaterThan",
        "isLessThan",
        "includes",
        "sign",
        "isInteger",
        "asInteger",
        "asApproximateFloat",
        "isQuantity",
        "isSemver",
        "major",
        "minor",
        "patch",
        "hasValue",
        "charAt",
        "optional.none",
    }
)
_LOOKUPS = frozenset({"_[_]", "_[?_]", "_?._"})


class _Walker:
    """One estimate: sizes and costs per node under local variable sizes."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.largest = 0
        self.visits = 0
        # How often the node being visited may run: comprehension bodies run once per
        # iteration, and the library allows ITERATIONS in all, however they nest.
        self.times = 1
        # Comprehension bodies are visited several times (to see how the accumulator grows);
        # results are memoized by node, the sizes of its free variables and `times`, so that
        # nesting does not make the walk exponential.
        self._free: dict[int, frozenset[str]] = {}
        self._memo: dict[tuple[int, tuple[int, ...], int], tuple[int, int, int]] = {}

    def node(self, n: checked.Node, env: dict[str, int]) -> tuple[int, int]:
        key = (id(n), tuple(env.get(name, -1) for name in sorted(self.free(n))), self.times)
        hit = self._memo.get(key)
        if hit is not None:
            self.largest = max(self.largest, hit[2])
            return hit[0], hit[1]
        self.visits += 1
        if self.visits > _MAX_VISITS:
            raise TooCostly("it is too complex to bound its cost (deeply nested comprehensions)")
        outer, self.largest = self.largest, 0
        size, cost = self._node(n, env)
        inner = max(self.largest, size)
        self.largest = max(outer, inner)
        self._memo[key] = (size, cost, inner)
        return size, cost

    def free(self, n: checked.Node) -> frozenset[str]:
        """The variable names `n` reads that it does not bind itself."""
        found = self._free.get(id(n))
        if found is not None:
            return found
        if isinstance(n, checked.Ident):
            found = frozenset((n.name,))
        elif isinstance(n, checked.Const):
            found = frozenset()
        elif isinstance(n, checked.Select):
            found = self.free(n.operand)
        elif isinstance(n, checked.Call):
            found = frozenset().union(*(self.free(p) for p in (n.args if n.target is None else (n.target, *n.args))))
        elif isinstance(n, checked.ListLit):
            found = frozenset().union(*(self.free(p) for p in n.elements))
        elif isinstance(n, checked.MapLit):
            found = frozenset().union(*(self.free(p) for e in n.entries for p in e if p is not None))
        else:
            body = frozenset().union(*(self.free(p) for p in (n.loop_condition, n.loop_step, n.result)))
            found = self.free(n.iter_range) | self.free(n.accu_init) | (body - {n.iter_var, n.iter_var2, n.accu_var})
        self._free[id(n)] = found
        return found

    def _node(self, n: checked.Node, env: dict[str, int]) -> tuple[int, int]:
        b = self.bounds
        if isinstance(n, checked.Const):
            return (len(n.value) if isinstance(n.value, str | bytes) else 1), self.times
        if isinstance(n, checked.Ident):
            fixed = {
                "device.driver": b.driver,
                "device.allowMultipleAllocations": 1,
                "device.attributes": b.attributes,
                "device.capacity": b.capacity,
            }
            return env.get(n.name, fixed.get(n.name, 1)), self.times
        if isinstance(n, checked.Select):
            size, cost = self.node(n.operand, env)
            return (1 if n.test_only else self._member(n.operand, size)), cost + self.times
        if isinstance(n, checked.ListLit | checked.MapLit):
            parts = (
                n.elements
                if isinstance(n, checked.ListLit)
                else tuple(p for e in n.entries for p in e if p is not None)
            )
            sizes, costs = zip(*(self.node(p, env) for p in parts), strict=True) if parts else ((), ())
            count = len(parts) if isinstance(n, checked.ListLit) else len(n.entries)
            total = sum(sizes) + count
            return total, sum(costs) + (total + 1) * self.times
        if isinstance(n, checked.Call):
            return self._call(n, env)
        return self._comprehension(n, env)

    def _member(self, operand: checked.Node, operand_size: int) -> int:
        """An element of a map or list is no larger than it; device maps have tighter bounds."""
        if isinstance(operand, checked.Call) and operand.function == "_[_]" and operand.args:
            container = operand.args[0]
            if isinstance(container, checked.Ident) and container.name == "device.attributes":
                return min(operand_size, self.bounds.attribute_value)
            if isinstance(container, checked.Ident) and container.name == "device.capacity":
                return min(operand_size, self.bounds.capacity_value)
        return operand_size

    def _element(self, n: checked.Node, size: int) -> int:
        """How large one element (a list item, or a map key) of a range can be."""
        if isinstance(n, checked.Ident) and n.name in ("device.attributes", "device.capacity"):
            return min(size, self.bounds.key)
        if _is_domain(n):
            return min(size, self.bounds.key)
        if (isinstance(n, checked.Call) and n.function == "_[_]" and n.args and _is_domain(n.args[0])) or (
            isinstance(n, checked.Select) and _is_domain(n.operand)
        ):
            return min(size, self.bounds.string)
        return size

    def _count(self, n: checked.Node, size: int, env: dict[str, int]) -> int:
        """How many elements a range has: a list or map has at most as many as its size."""
        if (
            isinstance(n, checked.Comprehension)
            and isinstance(n.result, checked.Ident)
            and n.result.name == n.accu_var
            and isinstance(n.accu_init, checked.ListLit)
            and not n.accu_init.elements
        ):
            # `map` and `filter` build at most one element per element of their range.
            return min(size, self._count(n.iter_range, self.node(n.iter_range, env)[0], env))
        if isinstance(n, checked.ListLit):
            return len(n.elements)
        if isinstance(n, checked.MapLit):
            return len(n.entries)
        if isinstance(n, checked.Ident) and n.name in ("device.attributes", "device.capacity"):
            return min(size, self.bounds.entries)
        if isinstance(n, checked.Call) and n.function == "_[_]" and n.args:
            container = n.args[0]
            if isinstance(container, checked.Ident) and container.name in ("device.attributes", "device.capacity"):
                return min(size, self.bounds.entries)
            if _is_domain(container):
                return min(size, self.bounds.values)  # a list-type attribute
        if isinstance(n, checked.Select) and _is_domain(n.operand):
            return min(size, self.bounds.values)
        return size

    def _call(self, n: checked.Call, env: dict[str, int]) -> tuple[int, int]:
        parts = n.args if n.target is None else (n.target, *n.args)
        estimates = [self.node(p, env) for p in parts]
        sizes = [s for s, _ in estimates]
        work = sum(c for _, c in estimates) + self.times
        f = n.function
        total = sum(sizes)
        if f in _SCALAR_RESULTS:
            # Comparisons, searches and conversions read their inputs once.
            return 1, work + total * self.times
        if f in _LOOKUPS:
            return self._member(parts[0], sizes[0]), work
        if f == "_?_:_":
            return max(sizes[1:]), work
        if f == "replace" and len(sizes) >= 3:
            # Every position of the receiver may be replaced, the empty string matches between characters.
            size = (sizes[0] + 1) * (sizes[2] + 1)
        elif f == "join":
            size = sizes[0] * ((sizes[1] if len(sizes) > 1 else 0) + 1) + sizes[0]
        elif f == "split":
            size = 2 * sizes[0] + 2
        elif f == "format":
            size = sizes[0] + 8 * total + 8
        elif f in ("quote", "strings.quote"):
            size = 6 * total + 2
        elif f in ("string", "bytes"):
            size = max(total, 32)
        else:
            # `+` concatenates; every other function here returns at most what it was given.
            size = total + 1
        return size, work + (size + total) * self.times

    def _comprehension(self, n: checked.Comprehension, env: dict[str, int]) -> tuple[int, int]:
        range_size, cost = self.node(n.iter_range, env)
        init_size, init_cost = self.node(n.accu_init, env)
        cost += init_cost
        # The library stops after ITERATIONS in all.
        count = min(self._count(n.iter_range, range_size, env), ITERATIONS)
        inner = dict(env)
        if n.iter_var:
            inner[n.iter_var] = self._element(n.iter_range, range_size)
        if n.iter_var2:
            inner[n.iter_var2] = range_size
        accu = init_size
        if count:
            inner[n.accu_var] = accu
            first = self.node(n.loop_step, inner)[0]
            inner[n.accu_var] = accu + _PROBE
            largest = self.largest  # the probe's sizes are not real
            probed = self.node(n.loop_step, inner)[0]
            self.largest = largest
            if probed == first:
                accu = max(accu, first)  # the step does not depend on the accumulator's size
            elif probed - _PROBE == first:
                accu = accu + count * max(first - accu, 0)  # it appends a bounded amount per iteration
            else:
                raise TooCostly("its comprehension accumulator may grow faster than linearly; it cannot be bounded")
            inner[n.accu_var] = accu
            outer, self.times = self.times, min(self.times * count, ITERATIONS)
            cost += self.node(n.loop_condition, inner)[1] + self.node(n.loop_step, inner)[1]
            self.times = outer
            self.largest = max(self.largest, accu)
        inner[n.accu_var] = accu
        size, result_cost = self.node(n.result, inner)
        return size, cost + result_cost + self.times


def _is_domain(n: checked.Node) -> bool:
    """`device.attributes[D]` or `device.capacity[D]`, whatever `D` is."""
    if isinstance(n, checked.Call) and n.function == "_[_]" and n.args:
        container = n.args[0]
        return isinstance(container, checked.Ident) and container.name in ("device.attributes", "device.capacity")
    return False
