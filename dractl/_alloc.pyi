"""Type stub of the Cython allocation core (`dractl/_alloc.pyx`). Plain data in and out."""

from typing_extensions import Buffer

OK: int
NO_FIT: int
SEARCH_LIMIT: int
CEL_ERROR: int
POLICY_FIRST_FIT: int
POLICY_BINPACK: int
MODE_EXACT: int
MODE_ALL: int
MATCH: int
DISTINCT: int
STAT_SHORT: int
STAT_COUNTER: int
STAT_LAST_COUNTER: int
STAT_CAPACITY: int
STAT_LAST_SLOT: int
STAT_CONSTRAINT: int
STAT_LAST_CONSTRAINT: int
STAT_SIZE: int
STAT_IN_USE: int
STAT_ALL_BLOCKED: int
STAT_BAD_POOL: int
N_STATS: int

class Core:
    """Usage state plus the static device, counter and capacity tables of one snapshot.

    int32 arrays: node_off, node_dev, cons_off, cons_id, chk_off, chk_id, cnt_set, set_off,
    set_dev, shares, dev_group; int64 arrays: cons_amt, cnt_avail, cnt_total, slot_value,
    slot_used; byte strings: node_bad, in_use, multi.
    """

    def __init__(
        self,
        *,
        node_off: Buffer,
        node_dev: Buffer,
        node_bad: Buffer,
        cons_off: Buffer,
        cons_id: Buffer,
        cons_amt: Buffer,
        chk_off: Buffer,
        chk_id: Buffer,
        cnt_avail: Buffer,
        cnt_total: Buffer,
        cnt_set: Buffer,
        set_off: Buffer,
        set_dev: Buffer,
        in_use: Buffer,
        multi: Buffer,
        shares: Buffer,
        slot_value: Buffer,
        slot_used: Buffer,
        dev_group: Buffer,
        n_groups: int,
        max_results: int,
        policy: int,
    ) -> None: ...
    def add_shape(
        self,
        cand: Buffer,
        select: Buffer,
        cap_off: Buffer | None = None,
        cap_slot: Buffer | None = None,
        cap_amt: Buffer | None = None,
        err: Buffer | None = None,
    ) -> int: ...
    def set_demand(self, shape: int, count: int, attr: int) -> None: ...
    def add_held(self, shape: int, devices: float) -> None: ...
    def add_attribute(self, off: Buffer, vals: Buffer, n_values: int) -> int: ...
    def set_held(self, d: int, in_use: bool, shares: int) -> None: ...
    def add_slot_used(self, d: int, slot: int, amount: int) -> None: ...
    def counter_available(self, c: int) -> int: ...
    def usage(
        self,
    ) -> tuple[bytes, list[int], list[int], list[int], list[int], list[int]]: ...
    def count_free(self, shape: int, *, admin: bool, nodes: Buffer) -> int: ...
    def free_per_node(self, shape: int, *, admin: bool, nodes: Buffer) -> list[int]: ...
    def free_on(self, shape: int, *, admin: bool, node: int) -> list[int]: ...
    def search(
        self, plan: Buffer, nodes: Buffer | None, *, limit: int, commit: bool
    ) -> tuple[int, int, list[int], list[int], list[int], list[list[int]]]: ...
