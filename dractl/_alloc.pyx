# cython: language_level=3
"""The allocation core: a complete depth-first search over plain integer arrays.

The facade (`dractl.alloc`) turns model values into indices: devices, nodes (each with the
devices it can see, in upstream's first-fit order), counters, capacity slots, request shapes
(a candidate byte per device plus the capacity each candidate would consume) and constraint
attributes (interned value ids per device). This module only searches, scores and keeps
the usage bookkeeping between calls. It does no I/O, knows no names, is deterministic (ties
are broken by position), and runs the node loop and the search without the GIL.

Layout: this file holds the tables, the usage bookkeeping (`set_held`, `_commit`), the node
precheck and the depth-first search; `_alloc_buffers.pxi` the per-search work buffers (one
allocation per search); `_alloc_binpack.pxi` binpack's demand model and scoring, which a
first-fit core never runs (it keeps no demand, units, pressures or rooms).
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
    # Binpack's demand model (see `_spare`; a first-fit core leaves these zero and NULL, see
    # `_add_shape_demand`): the most devices one request of the shape asks
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


cdef void _free_shape(Shape* s) noexcept:
    """Free every table of a shape (those not allocated are NULL)."""
    PyMem_Free(s.cand); PyMem_Free(s.select); PyMem_Free(s.err)
    PyMem_Free(s.cap_off); PyMem_Free(s.cap_slot); PyMem_Free(s.cap_amt)
    PyMem_Free(s.key_free); PyMem_Free(s.key_at)
    PyMem_Free(s.key_min); PyMem_Free(s.key_pressure); PyMem_Free(s.umask); PyMem_Free(s.overlap)


cdef struct Room:
    # One kind of room (see `_room_cost`): room for one request of shape `shape` that asks
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


include "_alloc_buffers.pxi"


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
        cdef int32_t k, c
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
        if (self.cnt_pend == NULL or self.slot_pend == NULL or self.pend_shares == NULL
                or self.alloc_count == NULL):
            raise MemoryError()
        memset(self.cnt_pend, 0, (self.n_cnt + 1) * sizeof(int64_t))
        memset(self.slot_pend, 0, (self.n_slot + 1) * sizeof(int64_t))
        memset(self.pend_shares, 0, (self.n_dev + 1) * sizeof(int32_t))
        memset(self.alloc_count, 0, (self.n_dev + 1) * sizeof(int32_t))
        if len(shares) != self.n_dev or len(dev_group) != self.n_dev:
            raise ValueError("table lengths do not match")
        self._validate(len(node_bad), len(cnt_total), len(in_use), len(multi), len(slot_used))
        self._init_node_held()
        if self.binpack:
            _init_binpack(self)

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
                _free_shape(&self.shapes[i])
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
        memset(s, 0, sizeof(Shape))
        try:
            s.cand = <uint8_t*> _copy(cand, 1, NULL)
            s.select = <uint8_t*> _copy(select, 1, NULL)
            if err is not None:
                s.err = <uint8_t*> _copy(err, 1, NULL)
            if cap_off is not None:
                if len(cap_off) != self.n_dev + 1 or len(cap_slot) != len(cap_amt):
                    raise ValueError("capacity tables must have one offset per device plus one")
                s.cap_off = <int32_t*> _copy(cap_off, sizeof(int32_t), &n)
                s.cap_slot = <int32_t*> _copy(cap_slot, sizeof(int32_t), &n)
                s.cap_amt = <int64_t*> _copy(cap_amt, sizeof(int64_t), NULL)
                _check_offsets(s.cap_off, self.n_dev, <int32_t> n)
                for i in range(n):
                    if s.cap_slot[i] < 0 or s.cap_slot[i] >= self.n_slot:
                        raise ValueError("capacity slot out of range")
            s.key_free = <int32_t*> PyMem_Malloc((self.n_nodes + 1) * sizeof(int32_t))
            s.key_at = <int64_t*> PyMem_Malloc((self.n_nodes + 1) * sizeof(int64_t))
            if s.key_free == NULL or s.key_at == NULL:
                raise MemoryError()
            for i in range(self.n_nodes + 1):
                s.key_at[i] = -1  # before every event: nothing is cached yet
            if self.binpack:
                _add_shape_demand(self, s)
        except BaseException:
            _free_shape(s)
            raise
        self.n_shapes += 1
        return self.n_shapes - 1

    def set_demand(self, int32_t shape, int32_t count, int32_t attr):
        """A request of the shape asks for `count` devices, all with one value of constraint
        attribute `attr` (-1: no such constraint). The shape's demand is the most any request of
        it known so far asks for (1 until one asks for more; it never falls), and each (count,
        attribute) from 2 devices on is a kind of room (see `_room_cost`, at most `MAX_ROOMS` per
        shape), counted here on every node. Only binpack keeps demand: first-fit checks the
        arguments and keeps nothing."""
        if shape < 0 or shape >= self.n_shapes:
            raise ValueError("unknown shape")
        if attr < -1 or attr >= self.n_attrs:
            raise ValueError("unknown attribute")
        if self.binpack:
            _set_demand(self, shape, count, attr)

    def add_held(self, int32_t shape, double devices):
        """Count `devices` more (fewer, when negative) held by requests of the shape: binpack
        weighs a shape by the demand the cluster holds (see `_spare`); first-fit keeps nothing."""
        if shape < 0 or shape >= self.n_shapes:
            raise ValueError("unknown shape")
        if self.binpack:
            _add_held(self, shape, devices)

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

    cdef void _touched(self, int32_t d) noexcept nogil:
        """The keys cached for the nodes that see `d` are out of date; for binpack, so are their
        rooms and the free share of `d`'s unit in every shape that counts that unit."""
        cdef int32_t k
        self.clock += 1
        for k in range(self.dev_node_off[d], self.dev_node_off[d + 1]):
            self.node_changed[self.dev_node[k]] = self.clock
        if self.binpack:
            _unit_touched(self, d)

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

    def free_per_node(self, int32_t shape, *, bint admin, nodes):
        """For each of `nodes`, how many candidates of `shape` it sees that are not held by
        earlier allocations (admin requests ignore them): `count_free` one node at a time, for
        reasons that name the best node. A device several nodes see counts on each."""
        cdef const int32_t[:] nv = nodes
        cdef int32_t i, k, d, node, n
        cdef Shape* s
        if shape < 0 or shape >= self.n_shapes:
            raise ValueError("unknown shape")
        s = &self.shapes[shape]
        counts = []
        for i in range(len(nodes)):
            node = nv[i]
            if node < 0 or node >= self.n_nodes:
                raise ValueError("unknown node")
            n = 0
            for k in range(self.node_off[node], self.node_off[node + 1]):
                d = self.node_dev[k]
                if s.cand[d] and (admin or self.multi[d] or not self.in_use[d]):
                    n += 1
            counts.append(n)
        return counts

    def free_on(self, int32_t shape, *, bint admin, int32_t node):
        """The candidates of `shape` that `node` sees and earlier allocations do not hold
        (admin requests ignore them), in the node's device order."""
        cdef int32_t k, d
        cdef Shape* s
        if shape < 0 or shape >= self.n_shapes:
            raise ValueError("unknown shape")
        if node < 0 or node >= self.n_nodes:
            raise ValueError("unknown node")
        s = &self.shapes[shape]
        found = []
        for k in range(self.node_off[node], self.node_off[node + 1]):
            d = self.node_dev[k]
            if s.cand[d] and (admin or self.multi[d] or not self.in_use[d]):
                found.append(d)
        return found

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
        cdef int32_t n_nodes, i, j, k, base, n_mem, total_cnt, status, node = -1
        cdef int32_t err_node = -1, err_alt = -1, err_dev = -1
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
        for i in range(n_nodes):
            k = i if nodes is None else nv[i]
            if self.node_off[k + 1] - self.node_off[k] > max_visible:
                max_visible = self.node_off[k + 1] - self.node_off[k]
        total_cnt = 0
        for i in range(s.n_cons):
            total_cnt += self.attrs[s.cons_attr[i]].n_values
        if self.binpack:
            _refresh_pressure(self)
            _refresh_rooms(self)
            for i in range(s.n_alts):
                _know_overlaps(self, s.alt_shape[i])
        _allocate_buffers(&s, n_nodes, max_visible, total_cnt, s.n_claims * self.max_results, self.n_rooms, self.binpack)
        try:
            for i in range(n_nodes):
                s.node_order[i] = i if nodes is None else nv[i]
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
                _room_plan(self, &s)
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
                    self._visit(&s, s.node_order[i])
                    # A node where the search would meet a selector error is searched, so
                    # that the error surfaces exactly where upstream's would.
                    if self._prep_error(&s) or self._free_error(&s):
                        s.node_order[j] = s.node_order[i]
                        j += 1
                        continue
                    if s.n_reqs > 0 and not has_admin and self.node_held[s.node] == s.n_visible:
                        for k in range(s.req_alt_off[0], s.req_alt_off[1]):
                            s.stats[k * N_STATS_C + S_SHORT] += 1
                        continue
                    if self._precheck(&s):
                        s.node_order[j] = s.node_order[i]
                        j += 1
                n_nodes = j
                if self.binpack:
                    _first_node(self, &s, s.node_order, n_nodes, s.node_keys, max_visible)
                status = R_FAIL
                for i in range(n_nodes):
                    if i == 1 and self.binpack:
                        # The first node did not fit: the others are needed in full order.
                        _sort_nodes(s.node_order + 1, s.node_keys + 1, n_nodes - 1, s.node_score, s.node_keys + n_nodes)
                    self._visit(&s, s.node_order[i])
                    # Upstream collects every All-mode set before it searches a node.
                    if self._prep_error(&s):
                        status = R_ERROR
                    else:
                        status = self._request(&s, 0)
                    if status == R_ERROR and self.binpack:
                        # Binpack tries failing devices last, so their error ends the attempt
                        # only when no node fits: remember the first one and go on.
                        if err_node < 0:
                            err_node, err_alt, err_dev = s.node_order[i], s.err_alt, s.err_dev
                        self._release(&s)
                        status = R_FAIL
                        continue
                    if status == 0 or status == R_ERROR:
                        node = s.node_order[i]
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
            PyMem_Free(s.block)

    # --- node order and precheck ---------------------------------------------------------

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
            sh.key_min[node] = _least_value(self, sh, node, False, &sh.key_pressure[node])
        sh.key_at[node] = self.clock

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
                _score_order(self, s, a, order, n, need)
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


include "_alloc_binpack.pxi"
