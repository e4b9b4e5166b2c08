# cython: language_level=3
"""The allocation core: a complete depth-first search over plain integer arrays.

The facade (`dractl.alloc`) turns model values into indices: devices, nodes (each with the
devices it can see, in upstream's first-fit order), counters, capacity slots, request shapes
(a candidate byte per device plus the capacity each candidate would consume) and constraint
attributes (interned value ids per device). This module only searches, scores and keeps
the usage bookkeeping between calls. It does no I/O, knows no names, is deterministic (ties
are broken by position), and runs the node loop and the search without the GIL.
"""

from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.math cimport floor, log, log2, pow
from libc.string cimport memcpy, memmove, memset

cdef enum:
    R_FAIL = 1          # internal search results; 0 is success
    R_LIMIT = 2
    R_SIZE = 3          # only the claim's result limit failed: other devices cannot help
    R_ERROR = 4         # the search met a device whose selector failed: the attempt ends
    C_MODE_EXACT = 0
    C_MODE_ALL = 1
    C_DISTINCT = 1
    C_POLICY_FIRST_FIT = 0
    C_POLICY_BINPACK = 1
    S_SHORT = 0         # nodes skipped: fewer free candidates than the request needs
    S_COUNTER = 1       # candidates refused because a counter ran out
    S_LAST_COUNTER = 2  # the last counter id that ran out (-1: none)
    S_CAPACITY = 3      # candidates refused because a capacity ran out
    S_LAST_SLOT = 4     # the last capacity slot that ran out (-1: none)
    S_CONSTRAINT = 5    # candidates refused by a constraint
    S_LAST_CONSTRAINT = 6
    S_SIZE = 7          # alternatives skipped because the claim would exceed 32 results
    S_IN_USE = 8        # candidates refused because they are taken within this call
    S_ALL_BLOCKED = 9   # All-mode requests that could not take every matching device
    S_BAD_POOL = 10     # All-mode requests on nodes with an incomplete or invalid pool
    N_STATS_C = 11

cdef int64_t INT64_LAST = 0x7FFFFFFFFFFFFFFF  # a rank after every other
cdef int32_t FLEX_NONE = 0x3FFFFFFF  # binpack's node key part for a shape without a free candidate there
cdef int64_t FLEX_SCALE = 0x40000000  # every flexibility is below this, so it is the last part of a rank
# `_flex` is log2(1 + pressure * PRESSURE_SCALE) in steps of 1 / PRESSURE_STEPS, then the devices
# of the unit (a partitionable GPU offers more than one that is not) in the last six bits.
cdef double PRESSURE_SCALE = 1048576.0
cdef double PRESSURE_STEPS = 262144.0
cdef double BUCKET_BASE = 1.1  # free shares enter rounded down to a power of this
cdef double COARSE_BASE = 1.25  # held demand and the fill ratio: rounded more coarsely, they change less often
cdef double FIXED = 16777216.0  # free shares are summed as integers in these steps, so sums are exact
cdef double PRESSURE_FIXED = 1099511627776.0  # pressures are summed as integers in these steps (2^40)
# The fill ratio (free units over used ones) counts at most this much: a cluster holding next to
# nothing would otherwise see it swing with every claim, and every swing recomputes the pressures.
cdef double RATIO_MOST = 100.0
cdef int32_t MAX_ROOMS = 4  # kinds of room (device count, attribute) kept per request shape
cdef double PRESSURE_NONE = 1048576.0  # a request without a free candidate on a node: after every other


cdef inline int32_t _bucket(double free) noexcept nogil:
    """The rounded logarithm of a free share: the pressure changes only when this does."""
    return _bucket_in(free, BUCKET_BASE)


cdef inline int32_t _bucket_in(double value, double base) noexcept nogil:
    if value < 0.5:
        return -1000
    return <int32_t> floor(log(value) / log(base) + 1e-9)


cdef inline int64_t _order_code(double value) noexcept nogil:
    """A value >= 0 as an integer that orders like it, cheaply: the top 32 bits of its IEEE 754
    form (sign, exponent, 20 bits of mantissa), which ascend with the value."""
    cdef int64_t bits
    memcpy(&bits, &value, sizeof(double))
    return bits >> 32


cdef inline int32_t _pressure_code(double pressure) noexcept nogil:
    """A pressure as an integer that orders like it: log2(1 + pressure * PRESSURE_SCALE) in
    steps of 1 / PRESSURE_STEPS, below `FLEX_SCALE >> 6`."""
    cdef double v = log2(1.0 + pressure * PRESSURE_SCALE) * PRESSURE_STEPS
    if v >= (FLEX_SCALE >> 6) - 1:
        v = (FLEX_SCALE >> 6) - 1
    return <int32_t> v


cdef inline double _scarcity(double spare) noexcept nogil:
    """How scarce a request shape is with `spare` GPUs' worth left over (see `Core._spare`):
    1 / (1 + spare), and past zero a line with the same slope, so a shape already short keeps
    costing one per GPU taken from it."""
    return 1.0 / (spare + 1.0) if spare >= 0.0 else 1.0 - spare


cdef inline int64_t _fixed(double share) noexcept nogil:
    return <int64_t> (share * FIXED + 0.5)


cdef inline double _rounded(int32_t bucket) noexcept nogil:
    """The free share a bucket stands for: none counts as a quarter of a unit, so a shape with
    nothing left free weighs much but finitely."""
    return _rounded_in(bucket, BUCKET_BASE)


cdef inline double _rounded_in(int32_t bucket, double base) noexcept nogil:
    return 0.25 if bucket == -1000 else pow(base, bucket)

# Search results (the facade maps them to reasons).
OK = 0
NO_FIT = 1
SEARCH_LIMIT = 2
CEL_ERROR = 3
# Policies, as `search` takes them.
POLICY_FIRST_FIT = C_POLICY_FIRST_FIT
POLICY_BINPACK = C_POLICY_BINPACK
# Request modes and constraint kinds, as the plan encodes them.
MODE_EXACT = C_MODE_EXACT
MODE_ALL = C_MODE_ALL
MATCH = 0
DISTINCT = C_DISTINCT
# Columns of the per-alternative failure statistics returned when nothing fits.
STAT_SHORT = S_SHORT
STAT_COUNTER = S_COUNTER
STAT_LAST_COUNTER = S_LAST_COUNTER
STAT_CAPACITY = S_CAPACITY
STAT_LAST_SLOT = S_LAST_SLOT
STAT_CONSTRAINT = S_CONSTRAINT
STAT_LAST_CONSTRAINT = S_LAST_CONSTRAINT
STAT_SIZE = S_SIZE
STAT_IN_USE = S_IN_USE
STAT_ALL_BLOCKED = S_ALL_BLOCKED
STAT_BAD_POOL = S_BAD_POOL
N_STATS = N_STATS_C


cdef void* _copy(object src, Py_ssize_t itemsize, Py_ssize_t* n) except NULL:
    """A PyMem copy of a contiguous buffer of `itemsize`-byte items, with one spare item so an
    empty table is still a valid pointer; the item count goes to `n` unless it is NULL. The
    item size is checked, so an int32 table handed where int64 is expected is refused."""
    view = memoryview(src)
    if view.itemsize != itemsize:
        raise ValueError(f"malformed plan: items of {view.itemsize} bytes where {itemsize} are expected")
    cdef const unsigned char[::1] raw = view.cast("B")
    cdef Py_ssize_t size = raw.shape[0]
    cdef void* out = PyMem_Malloc(size + itemsize)
    if out == NULL:
        raise MemoryError()
    if size:
        memcpy(out, &raw[0], size)
    if n != NULL:
        n[0] = size // itemsize
    return out


cdef int _check_offsets(const int32_t* off, int32_t n, int32_t total) except -1:
    """A CSR offset table of n rows over `total` entries: starts at 0, ends at total, ascends."""
    cdef int32_t i
    if off[0] != 0 or off[n] != total:
        raise ValueError("malformed plan")
    for i in range(n):
        if off[i + 1] < off[i]:
            raise ValueError("malformed plan")
    return 0


cdef struct Shape:
    uint8_t* cand       # per device: 1 if the device is a candidate for this request shape
    uint8_t* select     # per device: 1 if mode All must take it (candidates plus tainted ones)
    int32_t* cap_off    # per device CSR into cap_slot/cap_amt (NULL: consumes no capacity)
    int32_t* cap_slot
    int64_t* cap_amt
    uint8_t* err        # per device: 1 if evaluating a selector on it failed (NULL: none did)
    # Binpack's demand model (see `Core._spare`): the most devices one request of the shape asks
    # for (`demand`), the mean share of its unit (GPU) a candidate takes (`size`), the units
    # holding a candidate (`umask`, one byte per unit) and how much of them is free (`free`, in
    # units, fixed point, see `FIXED`; `bucket` is its rounded logarithm, see `_bucket`).
    double demand
    double size
    uint8_t* umask
    int64_t free
    int32_t bucket
    # `rooms`: how many kinds of room (`Core.rooms`) the shape has, one per (device count from 2
    # on, constraint attribute) its requests ask for. `overlap`, per kind of room, says whether
    # this shape's GPUs and the room's shape's meet (0 not known yet, 1 no, 2 yes; `n_overlap`
    # entries).
    int32_t rooms
    double held           # devices held by requests of the shape (see `Core.add_held`)
    int32_t held_bucket   # the rounded logarithm of held + demand (see `_bucket_in`, `COARSE_BASE`)
    int64_t share         # what the shape adds to the `pressure` of each of its units (fixed point)
    uint8_t* overlap
    int32_t n_overlap
    # Per node, cached (see `Core._node_cache`): how many of the shape's candidates on the node
    # are free, and the least `_flex` among them (`key_min`) with its unit's pressure
    # (`key_pressure`; binpack's key); valid while `key_at` is not older than the node's last change.
    int32_t* key_free
    int32_t* key_min
    double* key_pressure
    int64_t* key_at


cdef struct Room:
    # One kind of room (see `Core._room_cost`): room for one request of shape `shape` that asks
    # for `k` devices, all with one value of attribute `attr` (a matchAttribute constraint;
    # -1: none). The shape's candidates that could be allocated now, grouped by that value, hold
    # per node `rooms[2 * node]` rooms (k candidates each) and `rooms[2 * node + 1]` candidates
    # left over (loose); `total` rooms in all. `values`: scratch, one counter per value of the
    # attribute, all zero between uses.
    int32_t shape
    int32_t k
    int32_t attr
    int32_t* rooms
    int32_t* values
    int64_t total


cdef struct Attr:
    int32_t* off        # per device CSR into vals; an empty range means "attribute missing"
    int32_t* vals
    int32_t n_values


cdef struct Frame:
    int32_t dev
    int32_t req
    uint8_t charged     # counters were charged for this device
    uint8_t shared      # the device was taken as a (non-admin) share of a multi-allocatable device
    uint8_t capped      # the share's capacity was charged (admin access charges none)


cdef struct Search:
    # Plan (borrowed from the caller's buffer).
    int32_t n_claims, n_reqs, n_alts, n_cons
    const int32_t* claim_req_off
    const int32_t* req_alt_off
    const int32_t* alt_shape
    const int32_t* alt_mode
    const int32_t* alt_count
    const int32_t* alt_admin
    const int32_t* alt_mem_off
    const int32_t* mem_cons
    const int32_t* cons_kind
    const int32_t* cons_attr
    # Work buffers.
    int32_t* req_claim
    int32_t* alt_choice     # per request: the alternative being tried
    int32_t* order          # per request: n_visible slots, the device order for this request
    int32_t* order_len
    int32_t* err_last       # per request: the last order position holding an erroring device (-1: none)
    int32_t err_alt         # where the search met a selector error (R_ERROR)
    int32_t err_dev
    int32_t* claim_nres
    int32_t* cons_base      # per constraint: offset into cons_cnt
    int32_t* cons_members
    int32_t* cons_cnt
    Frame* stack
    int32_t depth
    int64_t steps
    int64_t limit
    int64_t* stats          # n_alts x N_STATS_C
    int64_t* rank           # binpack sort keys, one per visible device
    double* keep
    # Binpack's rooms (see `Core._room_cost`): the kinds of room the plan's requests take from
    # (`n_active` of them, by index), with the devices they would take and the room's shape's
    # spare, in the same positions.
    int32_t* room_active
    int32_t* room_take
    double* room_spare
    double* room_one        # what losing one room costs
    int32_t n_active
    int32_t policy
    # Current node.
    int32_t node
    const int32_t* visible      # the node's devices; request order buffers use n_visible as stride
    int32_t n_visible


cdef class Core:
    """Usage state plus the static device, counter and capacity tables of one snapshot.

    Invariant: between calls every pending (in-search) array is all zero; `search` commits
    a successful allocation into `in_use`, `shares`, `cnt_avail` and `slot_used` only when
    asked to.
    """

    cdef int32_t n_dev, n_nodes, n_cnt, n_slot, n_sets, n_groups, max_results
    cdef int32_t* node_off
    cdef int32_t* node_dev
    cdef uint8_t* node_bad
    cdef int32_t* node_held     # per node: how many of its visible devices are held (in_use)
    cdef int32_t* dev_node_off  # per device CSR: the nodes that see it
    cdef int32_t* dev_node
    cdef int32_t* set_cnt_off
    cdef int32_t* cons_off
    cdef int32_t* cons_id
    cdef int64_t* cons_amt
    cdef int32_t* chk_off
    cdef int32_t* chk_id
    cdef int64_t* cnt_avail
    cdef int64_t* cnt_total
    cdef int64_t* cnt_pend
    cdef int32_t* cnt_set
    cdef int32_t* set_off
    cdef int32_t* set_dev
    cdef uint8_t* in_use
    cdef uint8_t* multi
    cdef int32_t* shares
    cdef int32_t* pend_shares
    cdef int32_t* alloc_count
    cdef int64_t* slot_value
    cdef int64_t* slot_used
    cdef int64_t* slot_pend
    cdef int32_t* dev_group
    cdef double* dev_size
    cdef int32_t* group_free
    # Binpack's units: a GPU, which is the counter set its devices consume (a full GPU and its
    # MIG devices share one) or else a device of its own. `pressure[u]`: how much the request
    # shapes known want unit u (see `_flex`).
    cdef int32_t* unit
    cdef int32_t n_units
    cdef double* unit_frac      # per device: the share of its unit it takes (1 without counters)
    cdef int32_t* unit_dev      # per unit past the counter sets: its device
    cdef double* unit_free      # per unit: the share of it that is free
    cdef int64_t total_free     # their sum, fixed point (see `FIXED`)
    cdef int32_t ratio_bucket   # the rounded logarithm of 16 x the free units over the used ones
    cdef int64_t* pressure      # fixed point (see `PRESSURE_FIXED`), so that sums are exact
    cdef int32_t* unit_code     # per unit: `_flex` of its devices, computed when `pressure` changes
    cdef uint8_t* code_stale    # per unit: its pressure changed since `unit_code` was computed
    cdef bint pressure_stale
    cdef int32_t* node_used     # per node: how many of its visible devices are held or shared
    # Event clock of the cached binpack keys: `node_changed[n]` is when node n's devices last
    # changed hands, `values_changed` when `pressure` last changed (a shape or a demand was added).
    cdef int64_t clock, values_changed
    cdef int64_t* node_changed
    cdef Shape* shapes
    cdef int32_t n_shapes, cap_shapes
    # The kinds of room binpack keeps (`_room_cost`), and the nodes whose devices changed hands
    # since their rooms were last counted (`_refresh_rooms`).
    cdef Room* rooms
    cdef int32_t n_rooms, cap_rooms
    cdef int32_t* dirty
    cdef uint8_t* is_dirty
    cdef int32_t n_dirty
    cdef Attr* attrs
    cdef int32_t n_attrs, cap_attrs
    cdef bint binpack

    def __cinit__(self):
        self.shapes = NULL
        self.attrs = NULL
        self.rooms = NULL
        self.dirty = NULL
        self.is_dirty = NULL

    def __init__(self, *, node_off, node_dev, node_bad, cons_off, cons_id, cons_amt, chk_off, chk_id,
                 cnt_avail, cnt_total, cnt_set, set_off, set_dev, in_use, multi, shares,
                 slot_value, slot_used, dev_group, n_groups, int max_results, int policy):
        cdef Py_ssize_t n
        if max_results <= 0:
            raise ValueError("max_results must be positive")
        if policy not in (C_POLICY_FIRST_FIT, C_POLICY_BINPACK):
            raise ValueError("unknown policy")
        # Fixed for the core's life: first-fit keeps none of binpack's bookkeeping.
        self.binpack = policy == C_POLICY_BINPACK
        # The API's limit of results per claim, defined once in `dractl.model.limits`.
        self.max_results = max_results
        cdef int32_t d, k, c
        cdef double size
        self.node_off = <int32_t*> _copy(node_off, sizeof(int32_t), &n)
        self.n_nodes = <int32_t> (n - 1)
        self.node_dev = <int32_t*> _copy(node_dev, sizeof(int32_t), &n)
        self.node_bad = <uint8_t*> _copy(node_bad, 1, NULL)
        self.cons_off = <int32_t*> _copy(cons_off, sizeof(int32_t), &n)
        self.n_dev = <int32_t> (n - 1)
        self.cons_id = <int32_t*> _copy(cons_id, sizeof(int32_t), &n)
        self.cons_amt = <int64_t*> _copy(cons_amt, sizeof(int64_t), NULL)
        self.chk_off = <int32_t*> _copy(chk_off, sizeof(int32_t), &n)
        self.chk_id = <int32_t*> _copy(chk_id, sizeof(int32_t), &n)
        self.cnt_avail = <int64_t*> _copy(cnt_avail, sizeof(int64_t), NULL)
        self.cnt_total = <int64_t*> _copy(cnt_total, sizeof(int64_t), NULL)
        self.cnt_set = <int32_t*> _copy(cnt_set, sizeof(int32_t), &n)
        self.n_cnt = <int32_t> n
        self.set_off = <int32_t*> _copy(set_off, sizeof(int32_t), &n)
        self.n_sets = <int32_t> (n - 1)
        self.set_dev = <int32_t*> _copy(set_dev, sizeof(int32_t), &n)
        # Counter ids of one set are contiguous and sets ascend, so each set is a range.
        self.set_cnt_off = <int32_t*> PyMem_Malloc((self.n_sets + 2) * sizeof(int32_t))
        if self.set_cnt_off == NULL:
            raise MemoryError()
        k = 0
        for c in range(self.n_sets + 1):
            while k < self.n_cnt and self.cnt_set[k] < c:
                k += 1
            self.set_cnt_off[c] = k
        for c in range(1, self.n_cnt):
            if self.cnt_set[c] < self.cnt_set[c - 1]:
                raise ValueError("counters must be grouped by ascending counter set")
        self.in_use = <uint8_t*> _copy(in_use, 1, NULL)
        self.multi = <uint8_t*> _copy(multi, 1, NULL)
        self.shares = <int32_t*> _copy(shares, sizeof(int32_t), &n)
        self.slot_value = <int64_t*> _copy(slot_value, sizeof(int64_t), NULL)
        self.slot_used = <int64_t*> _copy(slot_used, sizeof(int64_t), NULL)
        self.n_slot = <int32_t> len(slot_value)
        self.dev_group = <int32_t*> _copy(dev_group, sizeof(int32_t), &n)
        self.n_groups = <int32_t> n_groups
        self.cnt_pend = <int64_t*> PyMem_Malloc((self.n_cnt + 1) * sizeof(int64_t))
        self.slot_pend = <int64_t*> PyMem_Malloc((self.n_slot + 1) * sizeof(int64_t))
        self.pend_shares = <int32_t*> PyMem_Malloc((self.n_dev + 1) * sizeof(int32_t))
        self.alloc_count = <int32_t*> PyMem_Malloc((self.n_dev + 1) * sizeof(int32_t))
        self.group_free = <int32_t*> PyMem_Malloc((self.n_groups + 1) * sizeof(int32_t))
        self.dev_size = <double*> PyMem_Malloc((self.n_dev + 1) * sizeof(double))
        self.unit = <int32_t*> PyMem_Malloc((self.n_dev + 1) * sizeof(int32_t))
        self.unit_frac = <double*> PyMem_Malloc((self.n_dev + 1) * sizeof(double))
        if (self.cnt_pend == NULL or self.slot_pend == NULL or self.pend_shares == NULL
                or self.alloc_count == NULL or self.group_free == NULL or self.dev_size == NULL
                or self.unit == NULL or self.unit_frac == NULL):
            raise MemoryError()
        memset(self.cnt_pend, 0, (self.n_cnt + 1) * sizeof(int64_t))
        memset(self.slot_pend, 0, (self.n_slot + 1) * sizeof(int64_t))
        memset(self.pend_shares, 0, (self.n_dev + 1) * sizeof(int32_t))
        memset(self.alloc_count, 0, (self.n_dev + 1) * sizeof(int32_t))
        memset(self.group_free, 0, (self.n_groups + 1) * sizeof(int32_t))
        if len(shares) != self.n_dev or len(dev_group) != self.n_dev:
            raise ValueError("table lengths do not match")
        self._validate(len(node_bad), len(cnt_total), len(in_use), len(multi), len(slot_used))
        self._init_node_held()
        self._init_units()
        # A partition's size is the share of its counter sets it takes; the binpack policy
        # keeps the largest still-placeable sibling as large as possible.
        for d in range(self.n_dev):
            size = 0.0
            for k in range(self.cons_off[d], self.cons_off[d + 1]):
                c = self.cons_id[k]
                if self.cnt_total[c] > 0:
                    size += <double> self.cons_amt[k] / <double> self.cnt_total[c]
            self.dev_size[d] = size

    cdef int _init_units(self) except -1:
        """Each device's unit and the share of it the device takes: for a device that consumes
        counters, its first counter set and the largest share it takes of a counter of that
        set with a total above 1 (engines and memory; the one-per-slice counters would make
        every MIG device look whole); otherwise a unit of its own, taken whole."""
        cdef int32_t d, k, c, st, u
        cdef double frac, part, any_part
        self.n_units = self.n_sets
        self.unit_dev = <int32_t*> PyMem_Malloc((self.n_dev + 1) * sizeof(int32_t))
        if self.unit_dev == NULL:
            raise MemoryError()
        for d in range(self.n_dev):
            if self.cons_off[d] == self.cons_off[d + 1]:
                self.unit[d] = self.n_units
                self.unit_dev[self.n_units - self.n_sets] = d
                self.n_units += 1
                self.unit_frac[d] = 1.0
                continue
            st = self.cnt_set[self.cons_id[self.cons_off[d]]]
            self.unit[d] = st
            frac = 0.0
            any_part = 0.0
            for k in range(self.cons_off[d], self.cons_off[d + 1]):
                c = self.cons_id[k]
                if self.cnt_set[c] != st or self.cnt_total[c] <= 0:
                    continue
                part = <double> self.cons_amt[k] / <double> self.cnt_total[c]
                if part > any_part:
                    any_part = part
                if self.cnt_total[c] > 1 and part > frac:
                    frac = part
            self.unit_frac[d] = min(1.0, frac if frac > 0.0 else any_part)
        self.pressure = <int64_t*> PyMem_Malloc((self.n_units + 1) * sizeof(int64_t))
        self.unit_code = <int32_t*> PyMem_Malloc((self.n_units + 1) * sizeof(int32_t))
        self.code_stale = <uint8_t*> PyMem_Malloc(self.n_units + 1)
        self.unit_free = <double*> PyMem_Malloc((self.n_units + 1) * sizeof(double))
        if self.pressure == NULL or self.unit_free == NULL or self.unit_code == NULL or self.code_stale == NULL:
            raise MemoryError()
        memset(self.pressure, 0, (self.n_units + 1) * sizeof(int64_t))
        memset(self.code_stale, 0, self.n_units + 1)
        for u in range(self.n_units):
            self.unit_code[u] = self._unit_code(u)
            self.unit_free[u] = self._free_share(u)
            self.total_free += _fixed(self.unit_free[u])
        self.ratio_bucket = self._ratio_bucket()
        return 0

    cdef double _free_share(self, int32_t u) noexcept nogil:
        """The share of unit `u` that is free: for a counter set, one minus the largest share
        consumed of a counter with a total above 1 (or of any counter when none has); for a
        device of its own, 0 when held whole, 1/2 while shared, else 1."""
        cdef int32_t c, d
        cdef double used = 0.0, any_used = 0.0, part
        if u >= self.n_sets:
            d = self.unit_dev[u - self.n_sets]
            if self.in_use[d]:
                return 0.0
            return 0.5 if self.shares[d] > 0 else 1.0
        for c in range(self.set_cnt_off[u], self.set_cnt_off[u + 1]):
            if self.cnt_total[c] <= 0:
                continue
            part = <double> (self.cnt_total[c] - self.cnt_avail[c]) / <double> self.cnt_total[c]
            if part > any_used:
                any_used = part
            if self.cnt_total[c] > 1 and part > used:
                used = part
        used = used if used > 0.0 else any_used
        return 0.0 if used >= 1.0 else 1.0 - used

    cdef int _init_node_held(self) except -1:
        """The reverse of the node lists (device -> nodes) and each node's held count."""
        cdef int32_t n, k, d
        cdef Py_ssize_t total = self.node_off[self.n_nodes]
        self.node_held = <int32_t*> PyMem_Malloc((self.n_nodes + 1) * sizeof(int32_t))
        self.node_used = <int32_t*> PyMem_Malloc((self.n_nodes + 1) * sizeof(int32_t))
        self.node_changed = <int64_t*> PyMem_Malloc((self.n_nodes + 1) * sizeof(int64_t))
        self.dev_node_off = <int32_t*> PyMem_Malloc((self.n_dev + 2) * sizeof(int32_t))
        self.dev_node = <int32_t*> PyMem_Malloc((total + 1) * sizeof(int32_t))
        self.dirty = <int32_t*> PyMem_Malloc((self.n_nodes + 1) * sizeof(int32_t))
        self.is_dirty = <uint8_t*> PyMem_Malloc(self.n_nodes + 1)
        if (self.node_held == NULL or self.node_used == NULL or self.node_changed == NULL
                or self.dev_node_off == NULL or self.dev_node == NULL or self.dirty == NULL or self.is_dirty == NULL):
            raise MemoryError()
        memset(self.is_dirty, 0, self.n_nodes + 1)
        memset(self.node_held, 0, (self.n_nodes + 1) * sizeof(int32_t))
        memset(self.node_used, 0, (self.n_nodes + 1) * sizeof(int32_t))
        memset(self.node_changed, 0, (self.n_nodes + 1) * sizeof(int64_t))
        memset(self.dev_node_off, 0, (self.n_dev + 2) * sizeof(int32_t))
        for k in range(total):
            self.dev_node_off[self.node_dev[k] + 2] += 1
        for d in range(self.n_dev):
            self.dev_node_off[d + 2] += self.dev_node_off[d + 1]
        for n in range(self.n_nodes):
            for k in range(self.node_off[n], self.node_off[n + 1]):
                d = self.node_dev[k]
                self.dev_node[self.dev_node_off[d + 1]] = n
                self.dev_node_off[d + 1] += 1
                if self.in_use[d]:
                    self.node_held[n] += 1
                if self.in_use[d] or self.shares[d] > 0:
                    self.node_used[n] += 1
        return 0

    cdef int _validate(self, Py_ssize_t n_bad, Py_ssize_t n_total, Py_ssize_t n_in_use, Py_ssize_t n_multi, Py_ssize_t n_used) except -1:
        """Refuse tables that do not fit together: the search trusts every index."""
        cdef int32_t i
        _check_offsets(self.node_off, self.n_nodes, <int32_t> (self.node_off[self.n_nodes]))
        _check_offsets(self.cons_off, self.n_dev, self.cons_off[self.n_dev])
        _check_offsets(self.chk_off, self.n_dev, self.chk_off[self.n_dev])
        _check_offsets(self.set_off, self.n_sets, self.set_off[self.n_sets])
        if (n_bad != self.n_nodes or n_total != self.n_cnt or n_in_use != self.n_dev
                or n_multi != self.n_dev or n_used != self.n_slot):
            raise ValueError("table lengths do not match")
        for i in range(self.node_off[self.n_nodes]):
            if self.node_dev[i] < 0 or self.node_dev[i] >= self.n_dev:
                raise ValueError("node device out of range")
        for i in range(self.cons_off[self.n_dev]):
            if self.cons_id[i] < 0 or self.cons_id[i] >= self.n_cnt:
                raise ValueError("consumed counter out of range")
        for i in range(self.chk_off[self.n_dev]):
            if self.chk_id[i] < 0 or self.chk_id[i] >= self.n_cnt:
                raise ValueError("checked counter out of range")
        for i in range(self.n_cnt):
            if self.cnt_set[i] < 0 or self.cnt_set[i] >= self.n_sets:
                raise ValueError("counter set out of range")
        for i in range(self.set_off[self.n_sets]):
            if self.set_dev[i] < 0 or self.set_dev[i] >= self.n_dev:
                raise ValueError("counter set device out of range")
        for i in range(self.n_dev):
            if self.dev_group[i] < -1 or self.dev_group[i] >= self.n_groups:
                raise ValueError("device group out of range")
        return 0

    def __dealloc__(self):
        cdef int32_t i
        PyMem_Free(self.node_off); PyMem_Free(self.node_dev); PyMem_Free(self.node_bad)
        PyMem_Free(self.node_held); PyMem_Free(self.dev_node_off); PyMem_Free(self.dev_node)
        PyMem_Free(self.node_used); PyMem_Free(self.node_changed)
        PyMem_Free(self.set_cnt_off)
        PyMem_Free(self.cons_off); PyMem_Free(self.cons_id); PyMem_Free(self.cons_amt)
        PyMem_Free(self.chk_off); PyMem_Free(self.chk_id)
        PyMem_Free(self.cnt_avail); PyMem_Free(self.cnt_total); PyMem_Free(self.cnt_pend)
        PyMem_Free(self.cnt_set); PyMem_Free(self.set_off); PyMem_Free(self.set_dev)
        PyMem_Free(self.in_use); PyMem_Free(self.multi); PyMem_Free(self.shares)
        PyMem_Free(self.pend_shares); PyMem_Free(self.alloc_count)
        PyMem_Free(self.slot_value); PyMem_Free(self.slot_used); PyMem_Free(self.slot_pend)
        PyMem_Free(self.dev_group); PyMem_Free(self.dev_size); PyMem_Free(self.group_free)
        PyMem_Free(self.unit); PyMem_Free(self.unit_frac); PyMem_Free(self.pressure); PyMem_Free(self.unit_code)
        PyMem_Free(self.code_stale)
        PyMem_Free(self.unit_dev); PyMem_Free(self.unit_free)
        if self.shapes != NULL:
            for i in range(self.n_shapes):
                PyMem_Free(self.shapes[i].cand)
                PyMem_Free(self.shapes[i].select)
                PyMem_Free(self.shapes[i].cap_off)
                PyMem_Free(self.shapes[i].cap_slot)
                PyMem_Free(self.shapes[i].cap_amt)
                PyMem_Free(self.shapes[i].err)
                PyMem_Free(self.shapes[i].key_min)
                PyMem_Free(self.shapes[i].key_pressure)
                PyMem_Free(self.shapes[i].key_free)
                PyMem_Free(self.shapes[i].key_at)
                PyMem_Free(self.shapes[i].umask)
                PyMem_Free(self.shapes[i].overlap)
            PyMem_Free(self.shapes)
        if self.rooms != NULL:
            for i in range(self.n_rooms):
                PyMem_Free(self.rooms[i].rooms)
                PyMem_Free(self.rooms[i].values)
            PyMem_Free(self.rooms)
        PyMem_Free(self.dirty); PyMem_Free(self.is_dirty)
        if self.attrs != NULL:
            for i in range(self.n_attrs):
                PyMem_Free(self.attrs[i].off)
                PyMem_Free(self.attrs[i].vals)
            PyMem_Free(self.attrs)

    def add_shape(self, cand, select, cap_off=None, cap_slot=None, cap_amt=None, err=None):
        """Register a request shape; returns its id. `cand` and `select` have one byte per
        device: the candidates, and the devices mode All must take (a superset). `err`
        (one byte per device, or None) marks the devices whose selector evaluation failed:
        the search ends with CEL_ERROR where it tries one of them (an ExactCount request
        that reaches it while it is free, or an All request on a node that shows it), as
        upstream's lazy evaluation would."""
        cdef Py_ssize_t n, i
        cdef Shape* grown
        if len(cand) != self.n_dev or len(select) != self.n_dev or (err is not None and len(err) != self.n_dev):
            raise ValueError("candidate vector length differs from the device count")
        if self.n_shapes == self.cap_shapes:
            self.cap_shapes = self.cap_shapes * 2 + 8
            grown = <Shape*> PyMem_Realloc(self.shapes, self.cap_shapes * sizeof(Shape))
            if grown == NULL:
                raise MemoryError()
            self.shapes = grown
        cdef Shape* s = &self.shapes[self.n_shapes]
        s.cand = <uint8_t*> _copy(cand, 1, NULL)
        s.select = <uint8_t*> _copy(select, 1, NULL)
        s.err = NULL if err is None else <uint8_t*> _copy(err, 1, NULL)
        s.key_min = NULL
        s.key_pressure = NULL
        s.key_free = NULL
        s.key_at = NULL
        s.rooms = 0
        s.held = 0.0
        s.held_bucket = 0
        s.overlap = NULL
        s.n_overlap = 0
        if cap_off is None:
            s.cap_off = NULL
            s.cap_slot = NULL
            s.cap_amt = NULL
        else:
            if len(cap_off) != self.n_dev + 1 or len(cap_slot) != len(cap_amt):
                raise ValueError("capacity tables must have one offset per device plus one")
            s.cap_off = <int32_t*> _copy(cap_off, sizeof(int32_t), &n)
            s.cap_slot = <int32_t*> _copy(cap_slot, sizeof(int32_t), &n)
            s.cap_amt = <int64_t*> _copy(cap_amt, sizeof(int64_t), NULL)
            try:
                _check_offsets(s.cap_off, self.n_dev, <int32_t> n)
                for i in range(n):
                    if s.cap_slot[i] < 0 or s.cap_slot[i] >= self.n_slot:
                        raise ValueError("capacity slot out of range")
            except ValueError:
                PyMem_Free(s.cand); PyMem_Free(s.select); PyMem_Free(s.err)
                PyMem_Free(s.cap_off); PyMem_Free(s.cap_slot); PyMem_Free(s.cap_amt)
                raise
        s.key_min = <int32_t*> PyMem_Malloc((self.n_nodes + 1) * sizeof(int32_t))
        s.key_pressure = <double*> PyMem_Malloc((self.n_nodes + 1) * sizeof(double))
        s.key_free = <int32_t*> PyMem_Malloc((self.n_nodes + 1) * sizeof(int32_t))
        s.key_at = <int64_t*> PyMem_Malloc((self.n_nodes + 1) * sizeof(int64_t))
        if s.key_min == NULL or s.key_pressure == NULL or s.key_free == NULL or s.key_at == NULL:
            PyMem_Free(s.cand); PyMem_Free(s.select); PyMem_Free(s.err)
            PyMem_Free(s.cap_off); PyMem_Free(s.cap_slot); PyMem_Free(s.cap_amt)
            PyMem_Free(s.key_min); PyMem_Free(s.key_pressure); PyMem_Free(s.key_free); PyMem_Free(s.key_at)
            raise MemoryError()
        for i in range(self.n_nodes + 1):
            s.key_at[i] = -1  # before every event: nothing is cached yet
        s.umask = <uint8_t*> PyMem_Malloc(self.n_units + 1)
        if s.umask == NULL:
            PyMem_Free(s.cand); PyMem_Free(s.select); PyMem_Free(s.err)
            PyMem_Free(s.cap_off); PyMem_Free(s.cap_slot); PyMem_Free(s.cap_amt)
            PyMem_Free(s.key_min); PyMem_Free(s.key_pressure); PyMem_Free(s.key_free); PyMem_Free(s.key_at)
            raise MemoryError()
        memset(s.umask, 0, self.n_units + 1)
        n = 0
        s.size = 0.0
        s.free = 0
        for i in range(self.n_dev):
            if s.cand[i]:
                n += 1
                s.size += self.unit_frac[i]
                if not s.umask[self.unit[i]]:
                    s.umask[self.unit[i]] = 1
                    s.free += _fixed(self.unit_free[self.unit[i]])
        s.size = s.size / n if n else 0.0
        s.bucket = _bucket(s.free / FIXED)
        s.demand = 1.0
        s.held_bucket = _bucket_in(1.0, COARSE_BASE)
        s.share = 0
        self.n_shapes += 1
        self.pressure_stale = True
        return self.n_shapes - 1

    def set_demand(self, int32_t shape, int32_t count, int32_t attr):
        """A request of the shape asks for `count` devices, all with one value of constraint
        attribute `attr` (-1: no such constraint). The shape's demand is the most any request of
        it known so far asks for (1 until one asks for more; it never falls), and each (count,
        attribute) from 2 devices on is a kind of room (see `_room_cost`, at most `MAX_ROOMS` per
        shape), counted here on every node."""
        cdef Shape* sh
        cdef Room* room
        cdef Room* grown
        cdef int32_t n, i, n_values
        if shape < 0 or shape >= self.n_shapes:
            raise ValueError("unknown shape")
        if attr < -1 or attr >= self.n_attrs:
            raise ValueError("unknown attribute")
        if not self.binpack:
            return
        sh = &self.shapes[shape]
        if count > sh.demand:
            sh.demand = count
            sh.held_bucket = _bucket_in(sh.held + sh.demand, COARSE_BASE)
            self.pressure_stale = True
        if count < 2 or sh.rooms >= MAX_ROOMS:
            return
        for i in range(self.n_rooms):
            if self.rooms[i].shape == shape and self.rooms[i].k == count and self.rooms[i].attr == attr:
                return
        if self.n_rooms == self.cap_rooms:
            grown = <Room*> PyMem_Realloc(self.rooms, (self.cap_rooms * 2 + 8) * sizeof(Room))
            if grown == NULL:
                raise MemoryError()
            self.rooms = grown
            self.cap_rooms = self.cap_rooms * 2 + 8
        n_values = self.attrs[attr].n_values if attr >= 0 else 0
        room = &self.rooms[self.n_rooms]
        room.rooms = <int32_t*> PyMem_Malloc((2 * self.n_nodes + 1) * sizeof(int32_t))
        room.values = <int32_t*> PyMem_Malloc((n_values + 1) * sizeof(int32_t))
        if room.rooms == NULL or room.values == NULL:
            PyMem_Free(room.rooms); PyMem_Free(room.values)
            raise MemoryError()
        memset(room.values, 0, (n_values + 1) * sizeof(int32_t))
        room.shape = shape
        room.k = count
        room.attr = attr
        room.total = 0
        for n in range(self.n_nodes):
            self._count_rooms(room, n)
            room.total += room.rooms[2 * n]
        self.n_rooms += 1
        sh.rooms += 1

    def add_held(self, int32_t shape, double devices):
        """Count `devices` more (fewer, when negative) held by requests of the shape: binpack
        weighs a shape by the demand the cluster holds (see `_spare`)."""
        cdef Shape* sh
        cdef int32_t b
        if shape < 0 or shape >= self.n_shapes:
            raise ValueError("unknown shape")
        if not self.binpack:
            return
        sh = &self.shapes[shape]
        sh.held += devices
        if sh.held < 0.0:
            sh.held = 0.0
        b = _bucket_in(sh.held + sh.demand, COARSE_BASE)
        if b != sh.held_bucket:
            sh.held_bucket = b
            self.pressure_stale = True

    cdef inline bint _allocatable(self, int32_t d) noexcept nogil:
        """Whether device `d` could be allocated now (without admin access): not held, and
        every counter it consumes has enough left (a share of a device already shared needs
        none)."""
        cdef int32_t j
        if self.in_use[d]:
            return False
        if self.multi[d] and self.shares[d] > 0:
            return True
        for j in range(self.cons_off[d], self.cons_off[d + 1]):
            if self.cnt_avail[self.cons_id[j]] < self.cons_amt[j]:
                return False
        return True

    cdef void _count_rooms(self, Room* room, int32_t node) noexcept nogil:
        """Count the room's rooms and loose candidates on `node` (see `Room`). A candidate
        without the attribute cannot join a room; one with several values counts by its first."""
        cdef int32_t k, d, v, free = 0, rooms = 0, loose = 0
        cdef Shape* sh = &self.shapes[room.shape]
        cdef Attr* at = NULL
        if room.attr >= 0:
            at = &self.attrs[room.attr]
        for k in range(self.node_off[node], self.node_off[node + 1]):
            d = self.node_dev[k]
            if not sh.cand[d] or not self._allocatable(d):
                continue
            if at == NULL:
                free += 1
            elif at.off[d] < at.off[d + 1]:
                room.values[at.vals[at.off[d]]] += 1
        if at == NULL:
            rooms = free // room.k
            loose = free % room.k
        else:
            for k in range(self.node_off[node], self.node_off[node + 1]):
                d = self.node_dev[k]
                if at.off[d] == at.off[d + 1]:
                    continue
                v = room.values[at.vals[at.off[d]]]
                if v > 0:
                    rooms += v // room.k
                    loose += v % room.k
                    room.values[at.vals[at.off[d]]] = 0
        room.rooms[2 * node] = rooms
        room.rooms[2 * node + 1] = loose

    cdef void _refresh_rooms(self) noexcept nogil:
        """Count the rooms again on the nodes whose devices changed hands since the last time."""
        cdef int32_t i, m, n
        cdef Room* room
        for i in range(self.n_dirty):
            n = self.dirty[i]
            self.is_dirty[n] = 0
            for m in range(self.n_rooms):
                room = &self.rooms[m]
                room.total -= room.rooms[2 * n]
                self._count_rooms(room, n)
                room.total += room.rooms[2 * n]
        self.n_dirty = 0

    cdef int _know_overlaps(self, int32_t shape) except -1:
        """Fill in the shape's `overlap` with every kind of room (needs the GIL: it may grow
        the table)."""
        cdef Shape* sh = &self.shapes[shape]
        cdef Shape* other
        cdef uint8_t* grown
        cdef int32_t m, u
        if sh.n_overlap < self.n_rooms:
            grown = <uint8_t*> PyMem_Realloc(sh.overlap, self.n_rooms + 1)
            if grown == NULL:
                raise MemoryError()
            sh.overlap = grown
            memset(sh.overlap + sh.n_overlap, 0, self.n_rooms - sh.n_overlap)
            sh.n_overlap = self.n_rooms
        for m in range(self.n_rooms):
            if sh.overlap[m]:
                continue
            other = &self.shapes[self.rooms[m].shape]
            sh.overlap[m] = 1
            for u in range(self.n_units):
                if sh.umask[u] and other.umask[u]:
                    sh.overlap[m] = 2
                    break
        return 0

    cdef int32_t _ratio_bucket(self) noexcept nogil:
        cdef double free = self.total_free / FIXED
        cdef double used = self.n_units - free
        if used < 0.5 or free > RATIO_MOST * used:
            return 1000000
        return _bucket_in(16.0 * free / used, COARSE_BASE)

    cdef double _spare(self, double supply, Shape* sh) noexcept nogil:
        """What is left of `supply` (GPUs' worth that could serve the shape) after the shape's
        share of filling the rest of the cluster with the mix it holds now: supply minus the
        GPUs' worth held by requests of the shape times the free units over the used ones (the
        fill ratio). A shape whose spare nears zero will run out first if the demand keeps its
        mix. Depends on usage only through rounded figures (`_bucket`: held devices are rounded
        with the shape's demand added, which is taken off again), so `pressure` stays valid
        between their changes."""
        cdef double ratio = (
            RATIO_MOST if self.ratio_bucket == 1000000 else _rounded_in(self.ratio_bucket, COARSE_BASE) / 16.0
        )
        cdef double held = _rounded_in(sh.held_bucket, COARSE_BASE) - sh.demand
        return supply - ratio * (held if held > 0.0 else 0.0) * sh.size

    cdef void _refresh_pressure(self) noexcept nogil:
        """Bring every unit's `pressure` (see `_flex`) up to date when a shape, a demand, the
        held demand, a shape's free share or the fill ratio changed its rounded value since the
        last time: each shape whose share changed adds the difference to its units, and every
        cached key is then stale. Fixed point, so the sums do not depend on the order."""
        cdef int32_t i, u
        cdef int64_t share, delta
        cdef double spare
        cdef bint changed = False
        cdef Shape* s
        if not self.pressure_stale:
            return
        for i in range(self.n_shapes):
            s = &self.shapes[i]
            if s.size <= 0.0:
                continue
            spare = self._spare(_rounded(s.bucket), s)
            share = <int64_t> ((_scarcity(spare - 1.0) - _scarcity(spare)) * PRESSURE_FIXED + 0.5)
            delta = share - s.share
            if delta == 0:
                continue
            s.share = share
            changed = True
            for u in range(self.n_units):
                if s.umask[u]:
                    self.pressure[u] += delta
                    self.code_stale[u] = 1
        self.pressure_stale = False
        if changed:
            for u in range(self.n_units):
                if self.code_stale[u]:
                    self.code_stale[u] = 0
                    self.unit_code[u] = self._unit_code(u)
            self.clock += 1
            self.values_changed = self.clock

    cdef int32_t _unit_code(self, int32_t u) noexcept nogil:
        """`_flex` of the devices of unit `u` (see there)."""
        cdef int32_t devices = 1 if u >= self.n_sets else self.set_off[u + 1] - self.set_off[u]
        return _pressure_code(self.pressure[u] / PRESSURE_FIXED) * 64 + (devices if devices < 63 else 63)

    def add_attribute(self, off, vals, int n_values):
        """Register a constraint attribute: per device a CSR range of interned value ids."""
        cdef Py_ssize_t n
        cdef Attr* grown
        if self.n_attrs == self.cap_attrs:
            self.cap_attrs = self.cap_attrs * 2 + 8
            grown = <Attr*> PyMem_Realloc(self.attrs, self.cap_attrs * sizeof(Attr))
            if grown == NULL:
                raise MemoryError()
            self.attrs = grown
        cdef Attr* a = &self.attrs[self.n_attrs]
        cdef Py_ssize_t i
        if len(off) != self.n_dev + 1:
            raise ValueError("attribute offsets must have one entry per device plus one")
        a.off = <int32_t*> _copy(off, sizeof(int32_t), &n)
        a.vals = <int32_t*> _copy(vals, sizeof(int32_t), &n)
        a.n_values = n_values
        try:
            _check_offsets(a.off, self.n_dev, <int32_t> n)
            for i in range(n):
                if a.vals[i] < 0 or a.vals[i] >= n_values:
                    raise ValueError("attribute value id out of range")
        except ValueError:
            PyMem_Free(a.off)
            PyMem_Free(a.vals)
            raise
        self.n_attrs += 1
        return self.n_attrs - 1

    def set_held(self, int32_t d, bint in_use, int32_t shares):
        """Set device `d`'s dedicated use and share count, as the facade's ledger says after a
        hold or a release. Keeps the invariant the search relies on: a device's counters are
        charged exactly while it is in use or shared, so they are charged on the first holder
        and given back when the last one leaves."""
        cdef int32_t k
        cdef bint before, after
        if d < 0 or d >= self.n_dev or shares < 0:
            raise ValueError("unknown device or negative share count")
        before = self.in_use[d] != 0 or self.shares[d] > 0
        after = in_use or shares > 0
        if (self.in_use[d] != 0) != in_use:
            for k in range(self.dev_node_off[d], self.dev_node_off[d + 1]):
                self.node_held[self.dev_node[k]] += 1 if in_use else -1
        if before != after:
            for k in range(self.dev_node_off[d], self.dev_node_off[d + 1]):
                self.node_used[self.dev_node[k]] += 1 if after else -1
            for k in range(self.cons_off[d], self.cons_off[d + 1]):
                self.cnt_avail[self.cons_id[k]] += -self.cons_amt[k] if after else self.cons_amt[k]
        self.in_use[d] = 1 if in_use else 0
        self.shares[d] = shares
        self._touched(d)

    def add_slot_used(self, int32_t d, int32_t slot, int64_t amount):
        """Add `amount` (negative to give back) to capacity slot `slot` of device `d`."""
        if d < 0 or d >= self.n_dev or slot < 0 or slot >= self.n_slot:
            raise ValueError("unknown device or capacity slot")
        self.slot_used[slot] += amount
        self._touched(d)

    def counter_available(self, int32_t c):
        """What is left of counter `c`: below 0 when the devices held overdraw it, as allocations made elsewhere
        and held unchecked can."""
        if c < 0 or c >= self.n_cnt:
            raise ValueError("unknown counter")
        return self.cnt_avail[c]

    def usage(self):
        """Every usage table, for tests that check a release restores the state exactly."""
        return (
            bytes([self.in_use[i] for i in range(self.n_dev)]),
            [self.shares[i] for i in range(self.n_dev)],
            [self.cnt_avail[i] for i in range(self.n_cnt)],
            [self.slot_used[i] for i in range(self.n_slot)],
            [self.node_held[i] for i in range(self.n_nodes)],
            [self.node_used[i] for i in range(self.n_nodes)],
        )

    cdef inline void _dirty_nodes(self, int32_t d) noexcept nogil:
        cdef int32_t k, n
        for k in range(self.dev_node_off[d], self.dev_node_off[d + 1]):
            n = self.dev_node[k]
            if not self.is_dirty[n]:
                self.is_dirty[n] = 1
                self.dirty[self.n_dirty] = n
                self.n_dirty += 1

    cdef void _touched(self, int32_t d) noexcept nogil:
        """The keys cached for the nodes that see `d` are out of date; for binpack, so are their
        rooms and the free share of `d`'s unit in every shape that counts that unit."""
        cdef int32_t k, i, u
        cdef int64_t delta
        cdef double share
        cdef Shape* s
        self.clock += 1
        for k in range(self.dev_node_off[d], self.dev_node_off[d + 1]):
            self.node_changed[self.dev_node[k]] = self.clock
        if not self.binpack:
            return
        u = self.unit[d]
        # The rooms of every node that sees a device of the same GPU: its counters changed too.
        if u < self.n_sets:
            for k in range(self.set_off[u], self.set_off[u + 1]):
                self._dirty_nodes(self.set_dev[k])
        else:
            self._dirty_nodes(d)
        share = self._free_share(u)
        if share == self.unit_free[u]:
            return
        delta = _fixed(share) - _fixed(self.unit_free[u])
        self.unit_free[u] = share
        self.total_free += delta
        i = self._ratio_bucket()
        if i != self.ratio_bucket:
            self.ratio_bucket = i
            self.pressure_stale = True
        for i in range(self.n_shapes):
            s = &self.shapes[i]
            if s.umask[u]:
                s.free += delta
                k = _bucket(s.free / FIXED)
                if k != s.bucket:
                    s.bucket = k
                    self.pressure_stale = True

    def count_free(self, int32_t shape, *, bint admin, nodes):
        """How many candidates of `shape` visible on any of `nodes` are not held by
        earlier allocations (admin requests ignore them); each device counts once."""
        cdef const int32_t[:] nv = nodes
        cdef int32_t i, k, d, node, n = 0
        cdef Shape* s
        if shape < 0 or shape >= self.n_shapes:
            raise ValueError("unknown shape")
        s = &self.shapes[shape]
        seen = bytearray(self.n_dev)
        for i in range(len(nodes)):
            node = nv[i]
            if node < 0 or node >= self.n_nodes:
                raise ValueError("unknown node")
            for k in range(self.node_off[node], self.node_off[node + 1]):
                d = self.node_dev[k]
                if not seen[d] and s.cand[d] and (admin or self.multi[d] or not self.in_use[d]):
                    seen[d] = 1
                    n += 1
        return n

    def search(self, plan, nodes, *, long long limit, bint commit):
        """Find devices for every request of the plan on the first node (in `nodes` order,
        or by score with the binpack policy) where they fit. Returns (status, node, alternative per
        request, devices, request per device, stats): on success (OK, node, ..., []); on
        failure (NO_FIT | SEARCH_LIMIT, -1, [], [], [], one stats row per alternative); when
        the search meets a device whose selector failed (see `add_shape`), (CEL_ERROR, node,
        [alternative], [device], [], stats) and nothing is held. Nodes are searched one after
        the other, so a node before the erroring one may still succeed."""
        cdef const int32_t[:] pv = plan
        cdef const int32_t[:] nv
        cdef Search s
        cdef int32_t n_nodes, i, j, k, base, n_mem, max_slots, total_cnt, best, status, node = -1
        cdef int32_t err_node = -1, err_alt = -1, err_dev = -1
        cdef int32_t* node_order
        cdef int32_t* node_score
        cdef int64_t* node_keys
        cdef bint has_admin
        cdef int32_t max_visible = 0
        cdef const int32_t* p
        if pv.shape[0] < 5:
            raise ValueError("malformed plan")
        p = &pv[0]
        memset(&s, 0, sizeof(Search))
        s.n_claims = p[0]; s.n_reqs = p[1]; s.n_alts = p[2]; s.n_cons = p[3]; n_mem = p[4]
        if s.n_claims < 0 or s.n_reqs < 0 or s.n_alts < 0 or s.n_cons < 0 or n_mem < 0:
            raise ValueError("malformed plan")
        base = 5
        s.claim_req_off = p + base; base += s.n_claims + 1
        s.req_alt_off = p + base; base += s.n_reqs + 1
        s.alt_shape = p + base; base += s.n_alts
        s.alt_mode = p + base; base += s.n_alts
        s.alt_count = p + base; base += s.n_alts
        s.alt_admin = p + base; base += s.n_alts
        s.alt_mem_off = p + base; base += s.n_alts + 1
        s.mem_cons = p + base; base += n_mem
        s.cons_kind = p + base; base += s.n_cons
        s.cons_attr = p + base; base += s.n_cons
        if base != pv.shape[0]:
            raise ValueError("malformed plan")
        _check_offsets(s.claim_req_off, s.n_claims, s.n_reqs)
        _check_offsets(s.req_alt_off, s.n_reqs, s.n_alts)
        _check_offsets(s.alt_mem_off, s.n_alts, n_mem)
        for i in range(s.n_alts):
            if s.alt_shape[i] < 0 or s.alt_shape[i] >= self.n_shapes:
                raise ValueError("unknown shape in plan")
            if s.alt_mode[i] not in (C_MODE_EXACT, C_MODE_ALL) or s.alt_count[i] < 0:
                raise ValueError("malformed plan")
        for i in range(n_mem):
            if s.mem_cons[i] < 0 or s.mem_cons[i] >= s.n_cons:
                raise ValueError("unknown constraint in plan")
        for i in range(s.n_cons):
            if s.cons_attr[i] < 0 or s.cons_attr[i] >= self.n_attrs:
                raise ValueError("unknown attribute in plan")
        if nodes is None:
            n_nodes = self.n_nodes
        else:
            nv = nodes
            n_nodes = <int32_t> nv.shape[0]
            for i in range(n_nodes):
                if nv[i] < 0 or nv[i] >= self.n_nodes:
                    raise ValueError("unknown node in node list")
        if self.binpack:
            self._refresh_pressure()
            self._refresh_rooms()
            for i in range(s.n_alts):
                self._know_overlaps(s.alt_shape[i])
        node_order = <int32_t*> PyMem_Malloc((n_nodes + 1) * sizeof(int32_t))
        if node_order == NULL:
            raise MemoryError()
        for i in range(n_nodes):
            node_order[i] = i if nodes is None else nv[i]
            j = self.node_off[node_order[i] + 1] - self.node_off[node_order[i]]
            if j > max_visible:
                max_visible = j
        max_slots = s.n_claims * self.max_results + 1
        total_cnt = 0
        for i in range(s.n_cons):
            total_cnt += self.attrs[s.cons_attr[i]].n_values
        s.cons_base = <int32_t*> PyMem_Malloc((s.n_cons + 1) * sizeof(int32_t))
        s.cons_cnt = <int32_t*> PyMem_Malloc((total_cnt + 1) * sizeof(int32_t))
        s.cons_members = <int32_t*> PyMem_Malloc((s.n_cons + 1) * sizeof(int32_t))
        s.req_claim = <int32_t*> PyMem_Malloc((s.n_reqs + 1) * sizeof(int32_t))
        s.alt_choice = <int32_t*> PyMem_Malloc((s.n_reqs + 1) * sizeof(int32_t))
        s.order = <int32_t*> PyMem_Malloc(((<Py_ssize_t> s.n_reqs) * max_visible + 1) * sizeof(int32_t))
        s.order_len = <int32_t*> PyMem_Malloc((s.n_reqs + 1) * sizeof(int32_t))
        s.err_last = <int32_t*> PyMem_Malloc((s.n_reqs + 1) * sizeof(int32_t))
        s.claim_nres = <int32_t*> PyMem_Malloc((s.n_claims + 1) * sizeof(int32_t))
        s.stack = <Frame*> PyMem_Malloc(max_slots * sizeof(Frame))
        s.stats = <int64_t*> PyMem_Malloc((s.n_alts * N_STATS_C + 1) * sizeof(int64_t))
        node_score = <int32_t*> PyMem_Malloc((n_nodes + 1) * sizeof(int32_t))
        node_keys = <int64_t*> PyMem_Malloc((2 * n_nodes + 1) * sizeof(int64_t))
        s.rank = <int64_t*> PyMem_Malloc((max_visible + 1) * sizeof(int64_t))
        s.keep = <double*> PyMem_Malloc((max_visible + 1) * sizeof(double))
        s.room_take = <int32_t*> PyMem_Malloc((self.n_rooms + 1) * sizeof(int32_t))
        s.room_active = <int32_t*> PyMem_Malloc((self.n_rooms + 1) * sizeof(int32_t))
        s.room_one = <double*> PyMem_Malloc((self.n_rooms + 1) * sizeof(double))
        s.room_spare = <double*> PyMem_Malloc((self.n_rooms + 1) * sizeof(double))
        if (node_score == NULL or node_keys == NULL or s.rank == NULL or s.keep == NULL
                or s.room_take == NULL or s.room_spare == NULL or s.room_active == NULL or s.room_one == NULL
                or s.cons_base == NULL or s.cons_cnt == NULL or s.cons_members == NULL
                or s.req_claim == NULL or s.alt_choice == NULL or s.order == NULL
                or s.order_len == NULL or s.err_last == NULL or s.claim_nres == NULL or s.stack == NULL
                or s.stats == NULL):
            PyMem_Free(node_order); PyMem_Free(node_score); PyMem_Free(node_keys)
            PyMem_Free(s.rank); PyMem_Free(s.keep); PyMem_Free(s.room_take); PyMem_Free(s.room_spare)
            PyMem_Free(s.room_active); PyMem_Free(s.room_one)
            PyMem_Free(s.cons_base); PyMem_Free(s.cons_cnt); PyMem_Free(s.cons_members)
            PyMem_Free(s.req_claim); PyMem_Free(s.alt_choice); PyMem_Free(s.order)
            PyMem_Free(s.order_len); PyMem_Free(s.err_last); PyMem_Free(s.claim_nres); PyMem_Free(s.stack)
            PyMem_Free(s.stats)
            raise MemoryError()
        total_cnt = 0
        for i in range(s.n_cons):
            s.cons_base[i] = total_cnt
            total_cnt += self.attrs[s.cons_attr[i]].n_values
        memset(s.cons_cnt, 0, (total_cnt + 1) * sizeof(int32_t))
        memset(s.cons_members, 0, (s.n_cons + 1) * sizeof(int32_t))
        memset(s.claim_nres, 0, (s.n_claims + 1) * sizeof(int32_t))
        memset(s.stats, 0, (s.n_alts * N_STATS_C + 1) * sizeof(int64_t))
        for i in range(s.n_alts):
            s.stats[i * N_STATS_C + S_LAST_COUNTER] = -1
            s.stats[i * N_STATS_C + S_LAST_SLOT] = -1
            s.stats[i * N_STATS_C + S_LAST_CONSTRAINT] = -1
        for i in range(s.n_claims):
            for j in range(s.claim_req_off[i], s.claim_req_off[i + 1]):
                s.req_claim[j] = i
        s.limit = limit
        s.policy = C_POLICY_BINPACK if self.binpack else C_POLICY_FIRST_FIT
        s.depth = 0
        if self.binpack:
            self._room_plan(&s)
        try:
            with nogil:
                # A node whose every device is held cannot serve a plan without admin
                # access; skipping it is the cheap common case of a filling cluster.
                has_admin = False
                for i in range(s.n_alts):
                    if s.alt_admin[i]:
                        has_admin = True
                # Nodes that pass the precheck, in name order; binpack then reorders them.
                j = 0
                for i in range(n_nodes):
                    self._visit(&s, node_order[i])
                    # A node where the search would meet a selector error is searched, so
                    # that the error surfaces exactly where upstream's would.
                    if self._prep_error(&s) or self._free_error(&s):
                        node_order[j] = node_order[i]
                        j += 1
                        continue
                    if (s.n_reqs > 0 and not has_admin
                            and self.node_held[node_order[i]] == self.node_off[node_order[i] + 1] - self.node_off[node_order[i]]):
                        for k in range(s.req_alt_off[0], s.req_alt_off[1]):
                            s.stats[k * N_STATS_C + S_SHORT] += 1
                        continue
                    if self._precheck(&s):
                        node_order[j] = node_order[i]
                        j += 1
                n_nodes = j
                if self.binpack:
                    self._first_node(&s, node_order, n_nodes, node_keys, max_visible)
                status = R_FAIL
                for i in range(n_nodes):
                    if i == 1 and self.binpack:
                        # The first node did not fit: the others are needed in full order.
                        self._sort_nodes(node_order + 1, node_keys + 1, n_nodes - 1, node_score, node_keys + n_nodes)
                    self._visit(&s, node_order[i])
                    # Upstream collects every All-mode set before it searches a node.
                    if self._prep_error(&s):
                        status = R_ERROR
                    else:
                        status = self._request(&s, 0)
                    if status == R_ERROR and self.binpack:
                        # Binpack tries failing devices last, so their error ends the attempt
                        # only when no node fits: remember the first one and go on.
                        if err_node < 0:
                            err_node, err_alt, err_dev = node_order[i], s.err_alt, s.err_dev
                        self._release(&s)
                        status = R_FAIL
                        continue
                    if status == 0 or status == R_ERROR:
                        node = node_order[i]
                        break
                    if status == R_LIMIT:
                        break
                if status == R_FAIL and err_node >= 0:
                    status, node, s.err_alt, s.err_dev = R_ERROR, err_node, err_alt, err_dev
            if status == R_LIMIT or status == R_ERROR:
                # The search stopped mid-way: give back everything it still holds.
                self._release(&s)
            if status == 0:
                alts = [s.alt_choice[i] for i in range(s.n_reqs)]
                devs = [s.stack[i].dev for i in range(s.depth)]
                reqs = [s.stack[i].req for i in range(s.depth)]
                if commit:
                    self._commit(&s)
                else:
                    self._release(&s)
                return 0, node, alts, devs, reqs, []
            stats = [[s.stats[i * N_STATS_C + k] for k in range(N_STATS_C)] for i in range(s.n_alts)]
            if status == R_ERROR:
                return CEL_ERROR, node, [s.err_alt], [s.err_dev], [], stats
            return (SEARCH_LIMIT if status == R_LIMIT else NO_FIT), -1, [], [], [], stats
        finally:
            PyMem_Free(node_order); PyMem_Free(node_score); PyMem_Free(node_keys)
            PyMem_Free(s.cons_base); PyMem_Free(s.cons_cnt); PyMem_Free(s.cons_members)
            PyMem_Free(s.req_claim); PyMem_Free(s.alt_choice); PyMem_Free(s.order)
            PyMem_Free(s.order_len); PyMem_Free(s.err_last); PyMem_Free(s.claim_nres); PyMem_Free(s.stack)
            PyMem_Free(s.stats); PyMem_Free(s.rank); PyMem_Free(s.keep)
            PyMem_Free(s.room_take); PyMem_Free(s.room_spare); PyMem_Free(s.room_active); PyMem_Free(s.room_one)

    # --- node order and precheck ---------------------------------------------------------

    cdef void _first_node(self, Search* s, int32_t* order, int32_t n, int64_t* keys, int32_t max_visible) noexcept nogil:
        """Binpack's node order, as far as most searches need it: the key of every node
        (`_node_keys`), and the node a stable sort by key puts first (the smallest key, the
        earliest of equal ones) moved to the front, the others keeping their order. Sorting
        them (`_sort_nodes`) then gives the whole order; the search does that only when the
        first node does not fit, which saves the sort in the common case."""
        cdef int32_t i, best = 0, first
        cdef int64_t key
        if n == 0:
            return
        self._node_keys(s, order, n, keys, max_visible)
        for i in range(1, n):
            if keys[i] < keys[best]:
                best = i
        first = order[best]
        key = keys[best]
        memmove(order + 1, order, best * sizeof(int32_t))
        memmove(keys + 1, keys, best * sizeof(int64_t))
        order[0] = first
        keys[0] = key

    cdef void _node_keys(self, Search* s, int32_t* order, int32_t n, int64_t* keys, int32_t max_visible) noexcept nogil:
        """Binpack's sort key per node, smallest first. First the nodes where the plan costs the
        known demand least: per request, the pressure on the least wanted free candidate's GPU
        (`_flex`) times the devices it asks for, plus the rooms the plan would break for requests
        that ask for several devices at once (`_room_cost`); then the units' devices (a GPU that
        cannot be partitioned first), then the most used nodes (devices held or shared); ties
        keep the given order (node names), which only decides between nodes alike in all of
        these."""
        cdef int32_t i, r, a, node, code
        cdef int64_t ties
        cdef double pressure, least
        cdef Shape* sh
        for i in range(n):
            node = order[i]
            pressure = self._room_cost(s, node)
            ties = 0
            for r in range(s.n_reqs):
                a = s.req_alt_off[r]
                sh = &self.shapes[s.alt_shape[a]]
                if s.alt_admin[a]:
                    code = self._least_value(sh, node, True, &least)
                else:
                    self._node_cache(sh, node)
                    code = sh.key_min[node]
                    least = sh.key_pressure[node]
                if code == FLEX_NONE:
                    pressure += PRESSURE_NONE
                else:
                    pressure += least * (s.alt_count[a] if s.alt_mode[a] == C_MODE_EXACT else 1)
                    ties += code & 63
            keys[i] = ((_order_code(pressure) * 2048 + (ties if ties < 2047 else 2047))
                       * (max_visible + 1) + (max_visible - self.node_used[node]))

    cdef void _room_plan(self, Search* s) noexcept nogil:
        """Per kind of room, what the plan takes from it and its shape's spare (see `_room_cost`):
        the same on every node, so computed once per search."""
        cdef int32_t m, r, a, take
        cdef Room* room
        cdef Shape* sh
        s.n_active = 0
        for m in range(self.n_rooms):
            room = &self.rooms[m]
            take = 0
            for r in range(s.n_reqs):
                a = s.req_alt_off[r]
                sh = &self.shapes[s.alt_shape[a]]
                if not s.alt_admin[a] and s.alt_mode[a] == C_MODE_EXACT and sh.overlap[m] == 2:
                    take += s.alt_count[a]
            if take > 0 and room.total > 0:
                s.room_active[s.n_active] = m
                s.room_take[s.n_active] = take
                s.room_spare[s.n_active] = self._spare(<double> room.total * room.k, &self.shapes[room.shape])
                s.room_one[s.n_active] = (_scarcity(s.room_spare[s.n_active] - room.k)
                                          - _scarcity(s.room_spare[s.n_active]))
                s.n_active += 1

    cdef double _room_cost(self, Search* s, int32_t node) noexcept nogil:
        """What the plan's placement on `node` costs the requests that ask for several devices
        at once (k of them on one node, maybe with one value of an attribute such as an NVLink
        partition): a room is room for one such request (`Room`). The plan takes the node's
        loose candidates first (binpack's order inside a node), then breaks rooms; the rooms
        lost shrink that shape's spare (`_spare`, with the rooms times k as its supply) by k
        GPUs each, which costs what it raises the shape's scarcity (`_scarcity`). So a whole
        node stays free for 8-GPU claims and a whole NVLink partition for NVLink claims while
        smaller requests fit where a room is already broken, and more so the fewer rooms are
        left. A request counts against a room when their GPUs meet (`overlap`), with as many
        devices as its first alternative asks for."""
        cdef int32_t i, take, lost, rooms, loose
        cdef double cost = 0.0
        cdef Room* room
        for i in range(s.n_active):
            room = &self.rooms[s.room_active[i]]
            take = s.room_take[i]
            rooms = room.rooms[2 * node]
            loose = room.rooms[2 * node + 1]
            if take <= loose or rooms == 0:
                continue
            # The plan takes loose candidates first (binpack's order inside a node), then rooms.
            if take - loose <= room.k:
                cost += s.room_one[i]
                continue
            lost = (take - loose + room.k - 1) // room.k
            if lost > rooms:
                lost = rooms
            cost += _scarcity(s.room_spare[i] - lost * room.k) - _scarcity(s.room_spare[i])
        return cost

    cdef int32_t _least_value(self, Shape* sh, int32_t node, bint admin, double* pressure) noexcept nogil:
        """The least flexibility (`_flex`) of the shape's candidates on `node` that are free
        (held ones count for admin access), or `FLEX_NONE` when there is none; the pressure
        on that candidate's unit goes to `pressure`."""
        cdef int32_t k, d, v
        cdef int32_t best = FLEX_NONE
        pressure[0] = PRESSURE_NONE
        for k in range(self.node_off[node], self.node_off[node + 1]):
            d = self.node_dev[k]
            if sh.cand[d] and (admin or self.multi[d] or not self.in_use[d]):
                v = self._flex(d)
                if v < best:
                    best = v
                    pressure[0] = self.pressure[self.unit[d]] / PRESSURE_FIXED
        return best

    cdef int32_t _flex(self, int32_t d) noexcept nogil:
        """How much the known demand wants the device's unit (its GPU): the sum, over the request
        shapes with a candidate on that GPU, of how much taking the GPU raises the shape's
        scarcity (`pressure`; `_spare`, `_scarcity`). A GPU is precious when the shapes it serves
        have little to spare for the mix the cluster holds: an A100 when MIG requests would run
        out of A100s first, an H100 when NVLink claims that select H100s would; a request that
        several kinds of GPU can serve goes where the rest of the demand loses least, whatever
        the nodes are called. A full GPU counts the shapes its MIG devices serve, as it shares
        their unit. The figures enter rounded (`_bucket`), so the cached node keys stay valid
        until a shape, a demand or a rounded figure changes (`values_changed`). The last six
        bits are the unit's devices: a GPU that cannot be partitioned before one that can, when
        nothing else differs."""
        return self.unit_code[self.unit[d]]

    cdef inline void _node_cache(self, Shape* sh, int32_t node) noexcept nogil:
        """Bring the shape's cached free count and (for binpack) least value on `node` (without
        admin access) up to date. Only a commit on the node or a new shape changes them, so most
        nodes reuse what an earlier search computed."""
        cdef int32_t k, d, free = 0
        if sh.key_at[node] >= self.node_changed[node] and sh.key_at[node] >= self.values_changed:
            return
        for k in range(self.node_off[node], self.node_off[node + 1]):
            d = self.node_dev[k]
            if sh.cand[d] and (self.multi[d] or not self.in_use[d]):
                free += 1
        sh.key_free[node] = free
        if self.binpack:
            sh.key_min[node] = self._least_value(sh, node, False, &sh.key_pressure[node])
        sh.key_at[node] = self.clock

    cdef void _sort_nodes(self, int32_t* order, int64_t* keys, int32_t n, int32_t* tmp_order, int64_t* tmp_keys) noexcept nogil:
        """Sort `order` by `keys` (both of length `n`, sorted together): a stable merge sort."""
        cdef int32_t i, lo, mid, hi, j, o, width
        cdef int32_t* src_o = order
        cdef int64_t* src_k = keys
        cdef int32_t* dst_o = tmp_order
        cdef int64_t* dst_k = tmp_keys
        cdef int32_t* swap_o
        cdef int64_t* swap_k
        if n <= 0:
            return
        width = 1
        while width < n:
            lo = 0
            while lo < n:
                mid = lo + width if lo + width < n else n
                hi = lo + 2 * width if lo + 2 * width < n else n
                i = lo
                j = mid
                o = lo
                while i < mid and j < hi:
                    if src_k[j] < src_k[i]:
                        dst_o[o] = src_o[j]; dst_k[o] = src_k[j]; j += 1
                    else:
                        dst_o[o] = src_o[i]; dst_k[o] = src_k[i]; i += 1
                    o += 1
                while i < mid:
                    dst_o[o] = src_o[i]; dst_k[o] = src_k[i]; i += 1; o += 1
                while j < hi:
                    dst_o[o] = src_o[j]; dst_k[o] = src_k[j]; j += 1; o += 1
                lo += 2 * width
            swap_o = src_o; src_o = dst_o; dst_o = swap_o
            swap_k = src_k; src_k = dst_k; dst_k = swap_k
            width *= 2
        if src_o != order:
            memcpy(order, src_o, n * sizeof(int32_t))

    cdef inline void _visit(self, Search* s, int32_t node) noexcept nogil:
        s.node = node
        s.visible = self.node_dev + self.node_off[node]
        s.n_visible = self.node_off[node + 1] - self.node_off[node]

    cdef bint _precheck(self, Search* s) noexcept nogil:
        """A necessary condition: every request has, on this node, at least as many free
        candidates as its smallest alternative needs."""
        cdef int32_t r, a, k, d, need, free, best_need
        cdef Shape* sh
        for r in range(s.n_reqs):
            best_need = -1
            for a in range(s.req_alt_off[r], s.req_alt_off[r + 1]):
                need = s.alt_count[a] if s.alt_mode[a] == C_MODE_EXACT else 1
                sh = &self.shapes[s.alt_shape[a]]
                free = 0
                if not s.alt_admin[a]:
                    self._node_cache(sh, s.node)
                    free = sh.key_free[s.node]
                else:
                    for k in range(s.n_visible):
                        d = s.visible[k]
                        if sh.cand[d]:
                            free += 1
                            if free >= need:
                                break
                if free >= need:
                    best_need = need
                    break
            if best_need < 0:
                for a in range(s.req_alt_off[r], s.req_alt_off[r + 1]):
                    s.stats[a * N_STATS_C + S_SHORT] += 1
                return False
        return True

    # --- the search -------------------------------------------------------------------------

    cdef int _request(self, Search* s, int32_t r) noexcept nogil:
        """Try the alternatives of request `r` in order (firstAvailable priority)."""
        cdef int32_t a, need, n, c, res, k, d, n_err
        cdef int32_t* order
        cdef Shape* sh
        if r == s.n_reqs:
            return 0
        c = s.req_claim[r]
        # When every alternative fails only on the claim's result limit, which depends on
        # counts and not on the devices chosen before, the signal goes up to the nearest
        # request with another alternative (upstream's "max size exceeded").
        only_size = True
        for a in range(s.req_alt_off[r], s.req_alt_off[r + 1]):
            s.steps += 1
            if s.steps > s.limit:
                return R_LIMIT
            s.alt_choice[r] = a
            sh = &self.shapes[s.alt_shape[a]]
            order = s.order + (<Py_ssize_t> r) * s.n_visible
            n = 0
            n_err = 0
            if s.alt_mode[a] == C_MODE_ALL:
                if self.node_bad[s.node]:
                    # All mode needs every pool of the node to be complete and valid.
                    s.stats[a * N_STATS_C + S_BAD_POOL] += 1
                    continue
                # Shares that no longer fit the capacity held by earlier allocations are
                # not part of the All set (upstream checks capacity when collecting it).
                for k in range(s.n_visible):
                    d = s.visible[k]
                    if sh.select[d] and (s.alt_admin[a] or not self._capacity_held(sh, d)):
                        order[n] = d
                        n += 1
            else:
                # Devices held by earlier allocations never fit a non-admin request, so
                # they are left out of its order (the All mode above must see them).
                # Devices whose selector failed stay in: trying one ends the search.
                for k in range(s.n_visible):
                    d = s.visible[k]
                    if (sh.cand[d] or (sh.err != NULL and sh.err[d])) and (s.alt_admin[a] or not self.in_use[d]):
                        order[n] = d
                        n += 1
                        if sh.err != NULL and sh.err[d]:
                            n_err += 1
            s.order_len[r] = n
            if s.alt_mode[a] == C_MODE_ALL:
                need = n
                if need == 0:
                    only_size = False
                    continue
            else:
                need = s.alt_count[a]
            if s.claim_nres[c] + need > self.max_results:
                s.stats[a * N_STATS_C + S_SIZE] += 1
                continue
            if n < need and n_err == 0:
                only_size = False
                continue
            if s.policy == C_POLICY_BINPACK and s.alt_mode[a] == C_MODE_EXACT:
                self._score_order(s, a, order, n, need)
            s.err_last[r] = -1
            if n_err:
                for k in range(n):
                    if sh.err[order[k]]:
                        s.err_last[r] = k
            res = self._slot(s, r, a, 0, 0, need)
            if res == R_SIZE:
                continue
            if res != R_FAIL:
                return res
            only_size = False
        return R_SIZE if only_size else R_FAIL

    cdef int _slot(self, Search* s, int32_t r, int32_t a, int32_t slot, int32_t pos, int32_t need) noexcept nogil:
        """Fill slot `slot` of request `r` (alternative `a`) with a device at an order
        position >= `pos` (combinations: positions increase within a request)."""
        cdef int32_t p, d, res, n
        cdef int32_t* order = s.order + (<Py_ssize_t> r) * s.n_visible
        cdef Shape* sh = &self.shapes[s.alt_shape[a]]
        s.steps += 1
        if s.steps > s.limit:
            return R_LIMIT
        if slot == need:
            res = self._request(s, r + 1)
            if res == R_SIZE and s.req_claim[r + 1] != s.req_claim[r]:
                # The next claim's limit says nothing about this claim's choices.
                return R_FAIL
            return res
        n = s.order_len[r]
        if s.alt_mode[a] == C_MODE_ALL:
            d = order[slot]
            if not sh.cand[d] or not self._add(s, r, a, d):
                s.stats[a * N_STATS_C + S_ALL_BLOCKED] += 1
                return R_FAIL
            res = self._slot(s, r, a, slot + 1, slot + 1, need)
            if res == 0 or res == R_LIMIT or res == R_ERROR:
                return res
            self._undo(s)
            return res
        p = pos
        # Too few positions left to fill the request end the loop, unless a device whose
        # selector failed is still ahead: upstream tries every device, and would meet it.
        while p < n and (n - p >= need - slot or p <= s.err_last[r]):
            d = order[p]
            if sh.err != NULL and sh.err[d]:
                # Upstream checks whether a device is in use before it evaluates selectors.
                if self._held(s, r, a, d):
                    s.stats[a * N_STATS_C + S_IN_USE] += 1
                    p += 1
                    continue
                s.err_alt = a
                s.err_dev = d
                return R_ERROR
            if self._add(s, r, a, d):
                res = self._slot(s, r, a, slot + 1, p + 1, need)
                if res == 0 or res == R_LIMIT or res == R_ERROR:
                    return res
                self._undo(s)
                if res == R_SIZE:
                    return R_SIZE
            p += 1
        return R_FAIL

    cdef bint _add(self, Search* s, int32_t r, int32_t a, int32_t d) noexcept nogil:
        """Take device `d` for request `r`; on refusal nothing stays charged."""
        cdef int32_t c = s.req_claim[r]
        cdef int32_t k, i, j, cid, kc
        cdef bint admin = s.alt_admin[a] != 0
        cdef bint shared = self.multi[d] != 0
        cdef bint charge, capped
        cdef Shape* sh = &self.shapes[s.alt_shape[a]]
        if self._held(s, r, a, d):
            s.stats[a * N_STATS_C + S_IN_USE] += 1
            return False
        # Counters: admin access neither needs nor consumes them; a share charges them once.
        charge = (not admin) and not (shared and self.shares[d] + self.pend_shares[d] > 0)
        if charge and self.cons_off[d] != self.cons_off[d + 1]:
            for k in range(self.cons_off[d], self.cons_off[d + 1]):
                self.cnt_pend[self.cons_id[k]] += self.cons_amt[k]
            for k in range(self.chk_off[d], self.chk_off[d + 1]):
                cid = self.chk_id[k]
                if self.cnt_pend[cid] > self.cnt_avail[cid]:
                    for i in range(self.cons_off[d], self.cons_off[d + 1]):
                        self.cnt_pend[self.cons_id[i]] -= self.cons_amt[i]
                    s.stats[a * N_STATS_C + S_COUNTER] += 1
                    s.stats[a * N_STATS_C + S_LAST_COUNTER] = cid
                    return False
        # Capacity of a share.
        capped = sh.cap_off != NULL and shared and not admin
        if capped:
            for k in range(sh.cap_off[d], sh.cap_off[d + 1]):
                self.slot_pend[sh.cap_slot[k]] += sh.cap_amt[k]
            for k in range(sh.cap_off[d], sh.cap_off[d + 1]):
                i = sh.cap_slot[k]
                if self.slot_used[i] + self.slot_pend[i] > self.slot_value[i]:
                    for j in range(sh.cap_off[d], sh.cap_off[d + 1]):
                        self.slot_pend[sh.cap_slot[j]] -= sh.cap_amt[j]
                    self._uncharge(d, charge)
                    s.stats[a * N_STATS_C + S_CAPACITY] += 1
                    s.stats[a * N_STATS_C + S_LAST_SLOT] = i
                    return False
        # Constraints that apply to this alternative.
        for i in range(s.alt_mem_off[a], s.alt_mem_off[a + 1]):
            kc = s.mem_cons[i]
            if not self._cons_add(s, kc, d):
                for j in range(s.alt_mem_off[a], i):
                    self._cons_remove(s, s.mem_cons[j], d)
                if capped:
                    for j in range(sh.cap_off[d], sh.cap_off[d + 1]):
                        self.slot_pend[sh.cap_slot[j]] -= sh.cap_amt[j]
                self._uncharge(d, charge)
                s.stats[a * N_STATS_C + S_CONSTRAINT] += 1
                s.stats[a * N_STATS_C + S_LAST_CONSTRAINT] = kc
                return False
        s.stack[s.depth].dev = d
        s.stack[s.depth].req = r
        s.stack[s.depth].charged = charge
        # An admin share holds nothing: it is neither a pending share (which would spare a
        # later share of this call its counters) nor "allocating" (shares never block).
        s.stack[s.depth].shared = shared and not admin
        s.stack[s.depth].capped = capped
        s.depth += 1
        s.claim_nres[c] += 1
        if shared:
            if not admin:
                self.pend_shares[d] += 1
        else:
            self.alloc_count[d] += 1
        return True

    cdef bint _held(self, Search* s, int32_t r, int32_t a, int32_t d) noexcept nogil:
        """Whether `d` is in use for alternative `a` of request `r`: admin access ignores
        other claims but never takes a device twice in one claim; a dedicated device is
        taken once; shares only need it not to be dedicated."""
        cdef int32_t i, c = s.req_claim[r]
        cdef bint shared = self.multi[d] != 0
        if s.alt_admin[a]:
            if not shared:
                for i in range(s.depth - 1, -1, -1):
                    if s.req_claim[s.stack[i].req] != c:
                        break
                    if s.stack[i].dev == d:
                        return True
            return False
        return self.in_use[d] or (not shared and self.alloc_count[d] > 0)

    cdef bint _prep_error(self, Search* s) noexcept nogil:
        """Whether collecting the All-mode sets on the current node meets a device whose
        selector failed (every device the node shows, in use or not, as upstream collects
        them before searching); records the first in plan and device order."""
        cdef int32_t a, k, d
        cdef Shape* sh
        if self.node_bad[s.node]:
            return False  # All mode cannot be used on this node at all
        for a in range(s.n_alts):
            sh = &self.shapes[s.alt_shape[a]]
            if s.alt_mode[a] != C_MODE_ALL or sh.err == NULL:
                continue
            for k in range(s.n_visible):
                d = s.visible[k]
                if sh.err[d]:
                    s.err_alt = a
                    s.err_dev = d
                    return True
        return False

    cdef bint _free_error(self, Search* s) noexcept nogil:
        """Whether an ExactCount alternative has, on the current node, a device whose
        selector failed and that earlier allocations do not hold (the search may meet it)."""
        cdef int32_t a, k, d
        cdef Shape* sh
        for a in range(s.n_alts):
            sh = &self.shapes[s.alt_shape[a]]
            if s.alt_mode[a] != C_MODE_EXACT or sh.err == NULL:
                continue
            for k in range(s.n_visible):
                d = s.visible[k]
                if sh.err[d] and (s.alt_admin[a] or not self.in_use[d]):
                    return True
        return False

    cdef inline bint _capacity_held(self, Shape* sh, int32_t d) noexcept nogil:
        """Whether a share of `d` would exceed a capacity already held by committed
        allocations (pending ones do not count)."""
        cdef int32_t k
        if sh.cap_off == NULL or not self.multi[d]:
            return False
        for k in range(sh.cap_off[d], sh.cap_off[d + 1]):
            if self.slot_used[sh.cap_slot[k]] + sh.cap_amt[k] > self.slot_value[sh.cap_slot[k]]:
                return True
        return False

    cdef inline void _uncharge(self, int32_t d, bint charge) noexcept nogil:
        cdef int32_t k
        if charge:
            for k in range(self.cons_off[d], self.cons_off[d + 1]):
                self.cnt_pend[self.cons_id[k]] -= self.cons_amt[k]

    cdef void _undo(self, Search* s) noexcept nogil:
        """Reverse the last `_add`."""
        cdef Frame* f
        cdef int32_t a, i, j, d
        cdef Shape* sh
        s.depth -= 1
        f = &s.stack[s.depth]
        d = f.dev
        a = s.alt_choice[f.req]
        sh = &self.shapes[s.alt_shape[a]]
        s.claim_nres[s.req_claim[f.req]] -= 1
        if f.capped:
            for j in range(sh.cap_off[d], sh.cap_off[d + 1]):
                self.slot_pend[sh.cap_slot[j]] -= sh.cap_amt[j]
        if f.shared:
            self.pend_shares[d] -= 1
        elif not self.multi[d]:
            self.alloc_count[d] -= 1
        self._uncharge(d, f.charged)
        for i in range(s.alt_mem_off[a], s.alt_mem_off[a + 1]):
            self._cons_remove(s, s.mem_cons[i], d)

    cdef bint _cons_add(self, Search* s, int32_t kc, int32_t d) noexcept nogil:
        """matchAttribute: the intersection of every member's value set stays non-empty
        (scalars are one-element sets). distinctAttribute: value sets are pairwise
        disjoint. Both are kept as per-value member counts, so removing a device restores
        the exact earlier state."""
        cdef Attr* at = &self.attrs[s.cons_attr[kc]]
        cdef int32_t* cnt = s.cons_cnt + s.cons_base[kc]
        cdef int32_t k, lo = at.off[d], hi = at.off[d + 1]
        cdef bint ok = False
        if lo == hi:
            return False
        if s.cons_kind[kc] == C_DISTINCT:
            for k in range(lo, hi):
                if cnt[at.vals[k]] > 0:
                    return False
            for k in range(lo, hi):
                cnt[at.vals[k]] += 1
            s.cons_members[kc] += 1
            return True
        s.cons_members[kc] += 1
        for k in range(lo, hi):
            cnt[at.vals[k]] += 1
            if cnt[at.vals[k]] == s.cons_members[kc]:
                ok = True
        if not ok:
            for k in range(lo, hi):
                cnt[at.vals[k]] -= 1
            s.cons_members[kc] -= 1
        return ok

    cdef void _cons_remove(self, Search* s, int32_t kc, int32_t d) noexcept nogil:
        cdef Attr* at = &self.attrs[s.cons_attr[kc]]
        cdef int32_t* cnt = s.cons_cnt + s.cons_base[kc]
        cdef int32_t k
        for k in range(at.off[d], at.off[d + 1]):
            cnt[at.vals[k]] -= 1
        s.cons_members[kc] -= 1

    # --- binpack scoring -----------------------------------------------------------------

    cdef void _score_order(self, Search* s, int32_t a, int32_t* order, int32_t n, int32_t need) noexcept nogil:
        """Reorder the candidates of one request: locality groups that can hold the whole
        request first (fewest free devices first), then partly used GPUs or counter sets,
        then the least flexible devices (`_flex`), then the placement that keeps the largest
        sibling partition placeable, then the first-fit position. Stable insertion sort over
        (rank, keep, position)."""
        cdef int32_t i, j, d, g
        cdef int64_t* rank = s.rank
        cdef double* keep = s.keep
        cdef int64_t kr
        cdef double kk
        cdef bint admin = s.alt_admin[a] != 0
        cdef Shape* sh = &self.shapes[s.alt_shape[a]]
        for i in range(n):
            d = order[i]
            g = self.dev_group[d]
            # A device whose selector failed is in `order` only to raise its error last: it
            # cannot help a group hold the request.
            if g >= 0 and self._free(d, admin) and not (sh.err != NULL and sh.err[d]):
                self.group_free[g] += 1
        for i in range(n):
            d = order[i]
            g = self.dev_group[d]
            kr = 0
            if g >= 0 and self.cons_off[d] == self.cons_off[d + 1]:
                if self.group_free[g] >= need:
                    kr = self.group_free[g]
                else:
                    kr = 1000000 - self.group_free[g]
            kr = ((kr * 2 + (0 if self._unit_used(d) else 1)) * 16 + self._breaks(sh, d)) * FLEX_SCALE + self._flex(d)
            if sh.err != NULL and sh.err[d]:
                # A device whose selector failed cannot be allocated: binpack tries it after
                # every candidate, so the error ends the attempt only when nothing else fits.
                kr = INT64_LAST
            rank[i] = kr
            keep[i] = self._keep_score(d) if self.cons_off[d] != self.cons_off[d + 1] else 0.0
        for i in range(n):
            g = self.dev_group[order[i]]
            if g >= 0:
                self.group_free[g] = 0
        for i in range(1, n):
            d = order[i]
            kr = rank[i]
            kk = keep[i]
            j = i - 1
            while j >= 0 and (rank[j] > kr or (rank[j] == kr and keep[j] < kk)):
                order[j + 1] = order[j]
                rank[j + 1] = rank[j]
                keep[j + 1] = keep[j]
                j -= 1
            order[j + 1] = d
            rank[j + 1] = kr
            keep[j + 1] = kk

    cdef int32_t _breaks(self, Shape* sh, int32_t d) noexcept nogil:
        """How many rooms with a constraint attribute (see `Room`) taking `d` would break on the
        current node, at most 15: its value's group holds only whole rooms, so nothing loose is
        left to take first. Counts the group on the spot (a node has few devices)."""
        cdef int32_t m, k, e, v, n, group, breaks = 0
        cdef Room* room
        cdef Shape* owner
        cdef Attr* at
        if sh.n_overlap < self.n_rooms:
            return 0
        for m in range(self.n_rooms):
            room = &self.rooms[m]
            if room.attr < 0 or sh.overlap[m] != 2:
                continue
            at = &self.attrs[room.attr]
            if at.off[d] == at.off[d + 1]:
                continue
            v = at.vals[at.off[d]]
            owner = &self.shapes[room.shape]
            group = 0
            for k in range(self.dev_node_off[d], self.dev_node_off[d + 1]):
                n = self.dev_node[k]
                for e in range(self.node_off[n], self.node_off[n + 1]):
                    if (at.off[self.node_dev[e]] < at.off[self.node_dev[e] + 1]
                            and at.vals[at.off[self.node_dev[e]]] == v and owner.cand[self.node_dev[e]]
                            and self._allocatable(self.node_dev[e])):
                        group += 1
                break
            if group >= room.k and group % room.k == 0:
                breaks += 1
        return breaks if breaks < 15 else 15

    cdef inline bint _free(self, int32_t d, bint admin) noexcept nogil:
        if admin:
            return True
        if self.multi[d]:
            return not self.in_use[d]
        return not self.in_use[d] and self.alloc_count[d] == 0

    cdef bint _unit_used(self, int32_t d) noexcept nogil:
        """Whether the GPU behind `d` is already partly used: a share exists, or a counter
        set it consumes has consumption."""
        cdef int32_t k, c, st, j
        if self.multi[d] and self.shares[d] + self.pend_shares[d] > 0:
            return True
        for k in range(self.cons_off[d], self.cons_off[d + 1]):
            c = self.cons_id[k]
            st = self.cnt_set[c]
            for j in range(self.set_cnt_off[st], self.set_cnt_off[st + 1]):
                if self.cnt_pend[j] > 0 or self.cnt_avail[j] < self.cnt_total[j]:
                    return True
        return False

    cdef double _keep_score(self, int32_t d) noexcept nogil:
        """The size of the largest free sibling (a device consuming the same first counter
        set) that would still fit after placing `d`."""
        cdef int32_t k, kk, j, c, sib, st
        cdef int64_t extra
        cdef double best = 0.0
        cdef bint fits
        st = self.cnt_set[self.cons_id[self.cons_off[d]]]
        for j in range(self.set_off[st], self.set_off[st + 1]):
            sib = self.set_dev[j]
            if sib == d or self.in_use[sib] or self.alloc_count[sib] > 0:
                continue
            if self.dev_size[sib] <= best:
                continue
            fits = True
            for k in range(self.cons_off[sib], self.cons_off[sib + 1]):
                c = self.cons_id[k]
                extra = 0
                for kk in range(self.cons_off[d], self.cons_off[d + 1]):
                    if self.cons_id[kk] == c:
                        extra += self.cons_amt[kk]
                if self.cnt_pend[c] + extra + self.cons_amt[k] > self.cnt_avail[c]:
                    fits = False
                    break
            if fits:
                best = self.dev_size[sib]
        return best

    # --- commit ----------------------------------------------------------------------------

    cdef void _commit(self, Search* s) noexcept nogil:
        """Make the found allocation permanent and clear every pending array."""
        cdef int32_t i, d, k, a
        cdef Shape* sh
        for i in range(s.depth):
            d = s.stack[i].dev
            a = s.alt_choice[s.stack[i].req]
            sh = &self.shapes[s.alt_shape[a]]
            if s.stack[i].capped:
                for k in range(sh.cap_off[d], sh.cap_off[d + 1]):
                    self.slot_pend[sh.cap_slot[k]] -= sh.cap_amt[k]
                    self.slot_used[sh.cap_slot[k]] += sh.cap_amt[k]
            if s.stack[i].shared:
                self.pend_shares[d] -= 1
            elif not self.multi[d]:
                self.alloc_count[d] -= 1
            if s.stack[i].charged:
                for k in range(self.cons_off[d], self.cons_off[d + 1]):
                    self.cnt_pend[self.cons_id[k]] -= self.cons_amt[k]
                    self.cnt_avail[self.cons_id[k]] -= self.cons_amt[k]
        # Shares and dedicated use are recorded after the counters, because whether a share
        # charged counters depended on the share count before this allocation.
        for i in range(s.depth):
            d = s.stack[i].dev
            if s.alt_admin[s.alt_choice[s.stack[i].req]]:
                continue
            if not self.in_use[d] and self.shares[d] == 0:
                for k in range(self.dev_node_off[d], self.dev_node_off[d + 1]):
                    self.node_used[self.dev_node[k]] += 1
            if s.stack[i].shared:
                self.shares[d] += 1
            elif not self.in_use[d]:
                self.in_use[d] = 1
                for k in range(self.dev_node_off[d], self.dev_node_off[d + 1]):
                    self.node_held[self.dev_node[k]] += 1
            self._touched(d)
        s.depth = 0

    cdef void _release(self, Search* s) noexcept nogil:
        while s.depth > 0:
            self._undo(s)
