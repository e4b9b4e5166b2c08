# Binpack's demand model and scoring, included by `_alloc.pyx` (plain functions over a `Core`).
#
# What it keeps: per GPU (a unit: a counter set, or a device of its own) the pressure of the
# request shapes known, the kinds of room kept for requests of several devices on one node,
# and the node and device orders binpack searches in. First-fit never calls any of it: a
# first-fit core neither computes units nor registers demand (see `Core.__init__`).

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
    """How scarce a request shape is with `spare` GPUs' worth left over (see `_spare`):
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


cdef int _init_binpack(Core core) except -1:
    """Binpack's tables of a new core: each device's size, unit and the share of its unit it
    takes, each unit's free share and pressure, and the scratch of `_score_order`.

    A partition's size is the share of its counter sets it takes (binpack keeps the largest
    still-placeable sibling as large as possible). A device's unit: for a device that consumes
    counters, its first counter set, of which it takes the largest share it takes of a counter
    of that set with a total above 1 (engines and memory; the one-per-slice counters would make
    every MIG device look whole); otherwise a unit of its own, taken whole."""
    cdef int32_t d, k, c, st, u
    cdef double frac, part, any_part, size
    core.group_free = <int32_t*> PyMem_Malloc((core.n_groups + 1) * sizeof(int32_t))
    core.dev_size = <double*> PyMem_Malloc((core.n_dev + 1) * sizeof(double))
    core.unit = <int32_t*> PyMem_Malloc((core.n_dev + 1) * sizeof(int32_t))
    core.unit_frac = <double*> PyMem_Malloc((core.n_dev + 1) * sizeof(double))
    core.unit_dev = <int32_t*> PyMem_Malloc((core.n_dev + 1) * sizeof(int32_t))
    if (core.group_free == NULL or core.dev_size == NULL or core.unit == NULL or core.unit_frac == NULL
            or core.unit_dev == NULL):
        raise MemoryError()
    memset(core.group_free, 0, (core.n_groups + 1) * sizeof(int32_t))
    for d in range(core.n_dev):
        size = 0.0
        for k in range(core.cons_off[d], core.cons_off[d + 1]):
            c = core.cons_id[k]
            if core.cnt_total[c] > 0:
                size += <double> core.cons_amt[k] / <double> core.cnt_total[c]
        core.dev_size[d] = size
    core.n_units = core.n_sets
    for d in range(core.n_dev):
        if core.cons_off[d] == core.cons_off[d + 1]:
            core.unit[d] = core.n_units
            core.unit_dev[core.n_units - core.n_sets] = d
            core.n_units += 1
            core.unit_frac[d] = 1.0
            continue
        st = core.cnt_set[core.cons_id[core.cons_off[d]]]
        core.unit[d] = st
        frac = 0.0
        any_part = 0.0
        for k in range(core.cons_off[d], core.cons_off[d + 1]):
            c = core.cons_id[k]
            if core.cnt_set[c] != st or core.cnt_total[c] <= 0:
                continue
            part = <double> core.cons_amt[k] / <double> core.cnt_total[c]
            if part > any_part:
                any_part = part
            if core.cnt_total[c] > 1 and part > frac:
                frac = part
        core.unit_frac[d] = min(1.0, frac if frac > 0.0 else any_part)
    core.pressure = <int64_t*> PyMem_Malloc((core.n_units + 1) * sizeof(int64_t))
    core.unit_code = <int32_t*> PyMem_Malloc((core.n_units + 1) * sizeof(int32_t))
    core.code_stale = <uint8_t*> PyMem_Malloc(core.n_units + 1)
    core.unit_free = <double*> PyMem_Malloc((core.n_units + 1) * sizeof(double))
    if core.pressure == NULL or core.unit_free == NULL or core.unit_code == NULL or core.code_stale == NULL:
        raise MemoryError()
    memset(core.pressure, 0, (core.n_units + 1) * sizeof(int64_t))
    memset(core.code_stale, 0, core.n_units + 1)
    for u in range(core.n_units):
        core.unit_code[u] = _unit_code(core, u)
        core.unit_free[u] = _free_share(core, u)
        core.total_free += _fixed(core.unit_free[u])
    core.ratio_bucket = _ratio_bucket(core)
    return 0


cdef double _free_share(Core core, int32_t u) noexcept nogil:
    """The share of unit `u` that is free: for a counter set, one minus the largest share
    consumed of a counter with a total above 1 (or of any counter when none has); for a
    device of its own, 0 when held whole, 1/2 while shared, else 1."""
    cdef int32_t c, d
    cdef double used = 0.0, any_used = 0.0, part
    if u >= core.n_sets:
        d = core.unit_dev[u - core.n_sets]
        if core.in_use[d]:
            return 0.0
        return 0.5 if core.shares[d] > 0 else 1.0
    for c in range(core.set_cnt_off[u], core.set_cnt_off[u + 1]):
        if core.cnt_total[c] <= 0:
            continue
        part = <double> (core.cnt_total[c] - core.cnt_avail[c]) / <double> core.cnt_total[c]
        if part > any_used:
            any_used = part
        if core.cnt_total[c] > 1 and part > used:
            used = part
    used = used if used > 0.0 else any_used
    return 0.0 if used >= 1.0 else 1.0 - used


cdef inline bint _allocatable(Core core, int32_t d) noexcept nogil:
    """Whether device `d` could be allocated now (without admin access): not held, and
    every counter it consumes has enough left (a share of a device already shared needs
    none)."""
    cdef int32_t j
    if core.in_use[d]:
        return False
    if core.multi[d] and core.shares[d] > 0:
        return True
    for j in range(core.cons_off[d], core.cons_off[d + 1]):
        if core.cnt_avail[core.cons_id[j]] < core.cons_amt[j]:
            return False
    return True


cdef void _count_rooms(Core core, Room* room, int32_t node) noexcept nogil:
    """Count the room's rooms and loose candidates on `node` (see `Room`). A candidate
    without the attribute cannot join a room; one with several values counts by its first."""
    cdef int32_t k, d, v, free = 0, rooms = 0, loose = 0
    cdef Shape* sh = &core.shapes[room.shape]
    cdef Attr* at = NULL
    if room.attr >= 0:
        at = &core.attrs[room.attr]
    for k in range(core.node_off[node], core.node_off[node + 1]):
        d = core.node_dev[k]
        if not sh.cand[d] or not _allocatable(core, d):
            continue
        if at == NULL:
            free += 1
        elif at.off[d] < at.off[d + 1]:
            room.values[at.vals[at.off[d]]] += 1
    if at == NULL:
        rooms = free // room.k
        loose = free % room.k
    else:
        for k in range(core.node_off[node], core.node_off[node + 1]):
            d = core.node_dev[k]
            if at.off[d] == at.off[d + 1]:
                continue
            v = room.values[at.vals[at.off[d]]]
            if v > 0:
                rooms += v // room.k
                loose += v % room.k
                room.values[at.vals[at.off[d]]] = 0
    room.rooms[2 * node] = rooms
    room.rooms[2 * node + 1] = loose


cdef void _refresh_rooms(Core core) noexcept nogil:
    """Count the rooms again on the nodes whose devices changed hands since the last time."""
    cdef int32_t i, m, n
    cdef Room* room
    for i in range(core.n_dirty):
        n = core.dirty[i]
        core.is_dirty[n] = 0
        for m in range(core.n_rooms):
            room = &core.rooms[m]
            room.total -= room.rooms[2 * n]
            _count_rooms(core, room, n)
            room.total += room.rooms[2 * n]
    core.n_dirty = 0


cdef int _know_overlaps(Core core, int32_t shape) except -1:
    """Fill in the shape's `overlap` with every kind of room (needs the GIL: it may grow
    the table)."""
    cdef Shape* sh = &core.shapes[shape]
    cdef Shape* other
    cdef uint8_t* grown
    cdef int32_t m, u
    if sh.n_overlap < core.n_rooms:
        grown = <uint8_t*> PyMem_Realloc(sh.overlap, core.n_rooms + 1)
        if grown == NULL:
            raise MemoryError()
        sh.overlap = grown
        memset(sh.overlap + sh.n_overlap, 0, core.n_rooms - sh.n_overlap)
        sh.n_overlap = core.n_rooms
    for m in range(core.n_rooms):
        if sh.overlap[m]:
            continue
        other = &core.shapes[core.rooms[m].shape]
        sh.overlap[m] = 1
        for u in range(core.n_units):
            if sh.umask[u] and other.umask[u]:
                sh.overlap[m] = 2
                break
    return 0


cdef int32_t _ratio_bucket(Core core) noexcept nogil:
    cdef double free = core.total_free / FIXED
    cdef double used = core.n_units - free
    if used < 0.5 or free > RATIO_MOST * used:
        return 1000000
    return _bucket_in(16.0 * free / used, COARSE_BASE)


cdef double _spare(Core core, double supply, Shape* sh) noexcept nogil:
    """What is left of `supply` (GPUs' worth that could serve the shape) after the shape's
    share of filling the rest of the cluster with the mix it holds now: supply minus the
    GPUs' worth held by requests of the shape times the free units over the used ones (the
    fill ratio). A shape whose spare nears zero will run out first if the demand keeps its
    mix. Depends on usage only through rounded figures (`_bucket`: held devices are rounded
    with the shape's demand added, which is taken off again), so `pressure` stays valid
    between their changes."""
    cdef double ratio = (
        RATIO_MOST if core.ratio_bucket == 1000000 else _rounded_in(core.ratio_bucket, COARSE_BASE) / 16.0
    )
    cdef double held = _rounded_in(sh.held_bucket, COARSE_BASE) - sh.demand
    return supply - ratio * (held if held > 0.0 else 0.0) * sh.size


cdef void _refresh_pressure(Core core) noexcept nogil:
    """Bring every unit's `pressure` (see `_flex`) up to date when a shape, a demand, the
    held demand, a shape's free share or the fill ratio changed its rounded value since the
    last time: each shape whose share changed adds the difference to its units, and every
    cached key is then stale. Fixed point, so the sums do not depend on the order."""
    cdef int32_t i, u
    cdef int64_t share, delta
    cdef double spare
    cdef bint changed = False
    cdef Shape* s
    if not core.pressure_stale:
        return
    for i in range(core.n_shapes):
        s = &core.shapes[i]
        if s.size <= 0.0:
            continue
        spare = _spare(core, _rounded(s.bucket), s)
        share = <int64_t> ((_scarcity(spare - 1.0) - _scarcity(spare)) * PRESSURE_FIXED + 0.5)
        delta = share - s.share
        if delta == 0:
            continue
        s.share = share
        changed = True
        for u in range(core.n_units):
            if s.umask[u]:
                core.pressure[u] += delta
                core.code_stale[u] = 1
    core.pressure_stale = False
    if changed:
        for u in range(core.n_units):
            if core.code_stale[u]:
                core.code_stale[u] = 0
                core.unit_code[u] = _unit_code(core, u)
        core.clock += 1
        core.values_changed = core.clock


cdef int32_t _unit_code(Core core, int32_t u) noexcept nogil:
    """`_flex` of the devices of unit `u` (see there)."""
    cdef int32_t devices = 1 if u >= core.n_sets else core.set_off[u + 1] - core.set_off[u]
    return _pressure_code(core.pressure[u] / PRESSURE_FIXED) * 64 + (devices if devices < 63 else 63)


cdef inline void _dirty_nodes(Core core, int32_t d) noexcept nogil:
    cdef int32_t k, n
    for k in range(core.dev_node_off[d], core.dev_node_off[d + 1]):
        n = core.dev_node[k]
        if not core.is_dirty[n]:
            core.is_dirty[n] = 1
            core.dirty[core.n_dirty] = n
            core.n_dirty += 1


cdef void _first_node(Core core, Search* s, int32_t* order, int32_t n, int64_t* keys, int32_t max_visible) noexcept nogil:
    """Binpack's node order, as far as most searches need it: the key of every node
    (`_node_keys`), and the node a stable sort by key puts first (the smallest key, the
    earliest of equal ones) moved to the front, the others keeping their order. Sorting
    them (`_sort_nodes`) then gives the whole order; the search does that only when the
    first node does not fit, which saves the sort in the common case."""
    cdef int32_t i, best = 0, first
    cdef int64_t key
    if n == 0:
        return
    _node_keys(core, s, order, n, keys, max_visible)
    for i in range(1, n):
        if keys[i] < keys[best]:
            best = i
    first = order[best]
    key = keys[best]
    memmove(order + 1, order, best * sizeof(int32_t))
    memmove(keys + 1, keys, best * sizeof(int64_t))
    order[0] = first
    keys[0] = key


cdef void _node_keys(Core core, Search* s, int32_t* order, int32_t n, int64_t* keys, int32_t max_visible) noexcept nogil:
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
        pressure = _room_cost(core, s, node)
        ties = 0
        for r in range(s.n_reqs):
            a = s.req_alt_off[r]
            sh = &core.shapes[s.alt_shape[a]]
            if s.alt_admin[a]:
                code = _least_value(core, sh, node, True, &least)
            else:
                core._node_cache(sh, node)
                code = sh.key_min[node]
                least = sh.key_pressure[node]
            if code == FLEX_NONE:
                pressure += PRESSURE_NONE
            else:
                pressure += least * (s.alt_count[a] if s.alt_mode[a] == C_MODE_EXACT else 1)
                ties += code & 63
        keys[i] = ((_order_code(pressure) * 2048 + (ties if ties < 2047 else 2047))
                   * (max_visible + 1) + (max_visible - core.node_used[node]))


cdef void _room_plan(Core core, Search* s) noexcept nogil:
    """Per kind of room, what the plan takes from it and its shape's spare (see `_room_cost`):
    the same on every node, so computed once per search."""
    cdef int32_t m, r, a, take
    cdef Room* room
    cdef Shape* sh
    s.n_active = 0
    for m in range(core.n_rooms):
        room = &core.rooms[m]
        take = 0
        for r in range(s.n_reqs):
            a = s.req_alt_off[r]
            sh = &core.shapes[s.alt_shape[a]]
            if not s.alt_admin[a] and s.alt_mode[a] == C_MODE_EXACT and sh.overlap[m] == 2:
                take += s.alt_count[a]
        if take > 0 and room.total > 0:
            s.room_active[s.n_active] = m
            s.room_take[s.n_active] = take
            s.room_spare[s.n_active] = _spare(core, <double> room.total * room.k, &core.shapes[room.shape])
            s.room_one[s.n_active] = (_scarcity(s.room_spare[s.n_active] - room.k)
                                      - _scarcity(s.room_spare[s.n_active]))
            s.n_active += 1


cdef double _room_cost(Core core, Search* s, int32_t node) noexcept nogil:
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
        room = &core.rooms[s.room_active[i]]
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


cdef int32_t _least_value(Core core, Shape* sh, int32_t node, bint admin, double* pressure) noexcept nogil:
    """The least flexibility (`_flex`) of the shape's candidates on `node` that are free
    (held ones count for admin access), or `FLEX_NONE` when there is none; the pressure
    on that candidate's unit goes to `pressure`."""
    cdef int32_t k, d, v
    cdef int32_t best = FLEX_NONE
    pressure[0] = PRESSURE_NONE
    for k in range(core.node_off[node], core.node_off[node + 1]):
        d = core.node_dev[k]
        if sh.cand[d] and (admin or core.multi[d] or not core.in_use[d]):
            v = _flex(core, d)
            if v < best:
                best = v
                pressure[0] = core.pressure[core.unit[d]] / PRESSURE_FIXED
    return best


cdef int32_t _flex(Core core, int32_t d) noexcept nogil:
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
    return core.unit_code[core.unit[d]]


cdef void _sort_nodes(int32_t* order, int64_t* keys, int32_t n, int32_t* tmp_order, int64_t* tmp_keys) noexcept nogil:
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


cdef void _score_order(Core core, Search* s, int32_t a, int32_t* order, int32_t n, int32_t need) noexcept nogil:
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
    cdef Shape* sh = &core.shapes[s.alt_shape[a]]
    for i in range(n):
        d = order[i]
        g = core.dev_group[d]
        # A device whose selector failed is in `order` only to raise its error last: it
        # cannot help a group hold the request.
        if g >= 0 and _free(core, d, admin) and not (sh.err != NULL and sh.err[d]):
            core.group_free[g] += 1
    for i in range(n):
        d = order[i]
        g = core.dev_group[d]
        kr = 0
        if g >= 0 and core.cons_off[d] == core.cons_off[d + 1]:
            if core.group_free[g] >= need:
                kr = core.group_free[g]
            else:
                kr = 1000000 - core.group_free[g]
        kr = ((kr * 2 + (0 if _unit_used(core, d) else 1)) * 16 + _breaks(core, sh, d)) * FLEX_SCALE + _flex(core, d)
        if sh.err != NULL and sh.err[d]:
            # A device whose selector failed cannot be allocated: binpack tries it after
            # every candidate, so the error ends the attempt only when nothing else fits.
            kr = INT64_LAST
        rank[i] = kr
        keep[i] = _keep_score(core, d) if core.cons_off[d] != core.cons_off[d + 1] else 0.0
    for i in range(n):
        g = core.dev_group[order[i]]
        if g >= 0:
            core.group_free[g] = 0
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


cdef int32_t _breaks(Core core, Shape* sh, int32_t d) noexcept nogil:
    """How many rooms with a constraint attribute (see `Room`) taking `d` would break on the
    current node, at most 15: its value's group holds only whole rooms, so nothing loose is
    left to take first. Counts the group on the spot (a node has few devices)."""
    cdef int32_t m, k, e, v, n, group, breaks = 0
    cdef Room* room
    cdef Shape* owner
    cdef Attr* at
    if sh.n_overlap < core.n_rooms:
        return 0
    for m in range(core.n_rooms):
        room = &core.rooms[m]
        if room.attr < 0 or sh.overlap[m] != 2:
            continue
        at = &core.attrs[room.attr]
        if at.off[d] == at.off[d + 1]:
            continue
        v = at.vals[at.off[d]]
        owner = &core.shapes[room.shape]
        group = 0
        for k in range(core.dev_node_off[d], core.dev_node_off[d + 1]):
            n = core.dev_node[k]
            for e in range(core.node_off[n], core.node_off[n + 1]):
                if (at.off[core.node_dev[e]] < at.off[core.node_dev[e] + 1]
                        and at.vals[at.off[core.node_dev[e]]] == v and owner.cand[core.node_dev[e]]
                        and _allocatable(core, core.node_dev[e])):
                    group += 1
            break
        if group >= room.k and group % room.k == 0:
            breaks += 1
    return breaks if breaks < 15 else 15


cdef inline bint _free(Core core, int32_t d, bint admin) noexcept nogil:
    if admin:
        return True
    if core.multi[d]:
        return not core.in_use[d]
    return not core.in_use[d] and core.alloc_count[d] == 0


cdef bint _unit_used(Core core, int32_t d) noexcept nogil:
    """Whether the GPU behind `d` is already partly used: a share exists, or a counter
    set it consumes has consumption."""
    cdef int32_t k, c, st, j
    if core.multi[d] and core.shares[d] + core.pend_shares[d] > 0:
        return True
    for k in range(core.cons_off[d], core.cons_off[d + 1]):
        c = core.cons_id[k]
        st = core.cnt_set[c]
        for j in range(core.set_cnt_off[st], core.set_cnt_off[st + 1]):
            if core.cnt_pend[j] > 0 or core.cnt_avail[j] < core.cnt_total[j]:
                return True
    return False


cdef double _keep_score(Core core, int32_t d) noexcept nogil:
    """The size of the largest free sibling (a device consuming the same first counter
    set) that would still fit after placing `d`."""
    cdef int32_t k, kk, j, c, sib, st
    cdef int64_t extra
    cdef double best = 0.0
    cdef bint fits
    st = core.cnt_set[core.cons_id[core.cons_off[d]]]
    for j in range(core.set_off[st], core.set_off[st + 1]):
        sib = core.set_dev[j]
        if sib == d or core.in_use[sib] or core.alloc_count[sib] > 0:
            continue
        if core.dev_size[sib] <= best:
            continue
        fits = True
        for k in range(core.cons_off[sib], core.cons_off[sib + 1]):
            c = core.cons_id[k]
            extra = 0
            for kk in range(core.cons_off[d], core.cons_off[d + 1]):
                if core.cons_id[kk] == c:
                    extra += core.cons_amt[kk]
            if core.cnt_pend[c] + extra + core.cons_amt[k] > core.cnt_avail[c]:
                fits = False
                break
        if fits:
            best = core.dev_size[sib]
    return best


cdef int _add_shape_demand(Core core, Shape* s) except -1:
    """Binpack's part of a new shape (`Core.add_shape`): its cached node keys, the units holding
    a candidate, their free share and the mean share of its unit a candidate takes; a demand of
    one device, none held. Every pressure is then stale. On failure the caller frees the shape."""
    cdef int32_t i, n = 0
    s.key_min = <int32_t*> PyMem_Malloc((core.n_nodes + 1) * sizeof(int32_t))
    s.key_pressure = <double*> PyMem_Malloc((core.n_nodes + 1) * sizeof(double))
    s.umask = <uint8_t*> PyMem_Malloc(core.n_units + 1)
    if s.key_min == NULL or s.key_pressure == NULL or s.umask == NULL:
        raise MemoryError()
    memset(s.umask, 0, core.n_units + 1)
    s.size = 0.0
    s.free = 0
    for i in range(core.n_dev):
        if s.cand[i]:
            n += 1
            s.size += core.unit_frac[i]
            if not s.umask[core.unit[i]]:
                s.umask[core.unit[i]] = 1
                s.free += _fixed(core.unit_free[core.unit[i]])
    s.size = s.size / n if n else 0.0
    s.bucket = _bucket(s.free / FIXED)
    s.demand = 1.0
    s.held = 0.0
    s.held_bucket = _bucket_in(1.0, COARSE_BASE)
    s.share = 0
    core.pressure_stale = True
    return 0


cdef int _set_demand(Core core, int32_t shape, int32_t count, int32_t attr) except -1:
    """`Core.set_demand` for binpack, with arguments checked: raise the shape's demand to
    `count`, and from 2 devices on register the kind of room and count it on every node."""
    cdef Shape* sh = &core.shapes[shape]
    cdef Room* room
    cdef Room* grown
    cdef int32_t n, i, n_values
    if count > sh.demand:
        sh.demand = count
        sh.held_bucket = _bucket_in(sh.held + sh.demand, COARSE_BASE)
        core.pressure_stale = True
    if count < 2 or sh.rooms >= MAX_ROOMS:
        return 0
    for i in range(core.n_rooms):
        if core.rooms[i].shape == shape and core.rooms[i].k == count and core.rooms[i].attr == attr:
            return 0
    if core.n_rooms == core.cap_rooms:
        grown = <Room*> PyMem_Realloc(core.rooms, (core.cap_rooms * 2 + 8) * sizeof(Room))
        if grown == NULL:
            raise MemoryError()
        core.rooms = grown
        core.cap_rooms = core.cap_rooms * 2 + 8
    n_values = core.attrs[attr].n_values if attr >= 0 else 0
    room = &core.rooms[core.n_rooms]
    room.rooms = <int32_t*> PyMem_Malloc((2 * core.n_nodes + 1) * sizeof(int32_t))
    room.values = <int32_t*> PyMem_Malloc((n_values + 1) * sizeof(int32_t))
    if room.rooms == NULL or room.values == NULL:
        PyMem_Free(room.rooms); PyMem_Free(room.values)
        raise MemoryError()
    memset(room.values, 0, (n_values + 1) * sizeof(int32_t))
    room.shape = shape
    room.k = count
    room.attr = attr
    room.total = 0
    for n in range(core.n_nodes):
        _count_rooms(core, room, n)
        room.total += room.rooms[2 * n]
    core.n_rooms += 1
    sh.rooms += 1
    return 0


cdef void _add_held(Core core, int32_t shape, double devices) noexcept:
    """`Core.add_held` for binpack, with arguments checked."""
    cdef Shape* sh = &core.shapes[shape]
    cdef int32_t b
    sh.held += devices
    if sh.held < 0.0:
        sh.held = 0.0
    b = _bucket_in(sh.held + sh.demand, COARSE_BASE)
    if b != sh.held_bucket:
        sh.held_bucket = b
        core.pressure_stale = True


cdef void _unit_touched(Core core, int32_t d) noexcept nogil:
    """Binpack's part of `Core._touched`: the rooms of the nodes that see `d`'s unit are out of
    date, and so is the free share of that unit in every shape that counts it."""
    cdef int32_t k, i, u
    cdef int64_t delta
    cdef double share
    cdef Shape* s
    u = core.unit[d]
    # The rooms of every node that sees a device of the same GPU: its counters changed too.
    if u < core.n_sets:
        for k in range(core.set_off[u], core.set_off[u + 1]):
            _dirty_nodes(core, core.set_dev[k])
    else:
        _dirty_nodes(core, d)
    share = _free_share(core, u)
    if share == core.unit_free[u]:
        return
    delta = _fixed(share) - _fixed(core.unit_free[u])
    core.unit_free[u] = share
    core.total_free += delta
    i = _ratio_bucket(core)
    if i != core.ratio_bucket:
        core.ratio_bucket = i
        core.pressure_stale = True
    for i in range(core.n_shapes):
        s = &core.shapes[i]
        if s.umask[u]:
            s.free += delta
            k = _bucket(s.free / FIXED)
            if k != s.bucket:
                s.bucket = k
                core.pressure_stale = True

