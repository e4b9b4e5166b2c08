# The per-search work buffers, included by `_alloc.pyx`: one allocation per search, freed in one
# place (`Core.search`'s `finally`), however the search ends.

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
    # Work buffers, all carved from `block` (see `_allocate_buffers`).
    void* block
    int32_t* node_order     # the nodes to search, in search order
    int32_t* node_score     # binpack: scratch of the node sort
    int64_t* node_keys      # binpack: per node its sort key, then scratch of the node sort
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
    # Binpack's rooms (see `_room_cost`): the kinds of room the plan's requests take from
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


cdef enum:
    # The buffers of one search, in the order they are laid out in its block.
    B_NODE_ORDER, B_NODE_SCORE, B_NODE_KEYS, B_REQ_CLAIM, B_ALT_CHOICE, B_ORDER, B_ORDER_LEN, B_ERR_LAST,
    B_CLAIM_NRES, B_CONS_BASE, B_CONS_MEMBERS, B_CONS_CNT, B_STACK, B_STATS, B_RANK, B_KEEP,
    B_ROOM_ACTIVE, B_ROOM_TAKE, B_ROOM_SPARE, B_ROOM_ONE, N_BUFFERS

cdef size_t BUFFER_ALIGN = 16  # every buffer starts at a multiple of this, whatever its item type


cdef int _allocate_buffers(Search* s, Py_ssize_t n_nodes, Py_ssize_t max_visible, Py_ssize_t n_values,
                           Py_ssize_t max_depth, Py_ssize_t n_rooms, bint binpack) except -1:
    """Carve every work buffer of the search from one allocation (`s.block`), for a plan already
    in `s`, `n_nodes` nodes of at most `max_visible` devices, `n_values` constraint values in
    all, `max_depth` devices taken at most and `n_rooms` kinds of room. Each buffer has one
    spare item, so an empty one is still a valid pointer; the buffers only binpack reads are
    empty under first-fit. The contents are undefined: `Core.search` initializes what it reads.
    On failure nothing is allocated and MemoryError is raised."""
    cdef Py_ssize_t sizes[N_BUFFERS]
    cdef size_t offsets[N_BUFFERS]
    cdef size_t total = 0
    cdef char* base
    cdef int i
    cdef Py_ssize_t scored = n_nodes if binpack else 0
    cdef Py_ssize_t visible = max_visible if binpack else 0
    cdef Py_ssize_t rooms = n_rooms if binpack else 0
    sizes[B_NODE_ORDER] = (n_nodes + 1) * sizeof(int32_t)
    sizes[B_NODE_SCORE] = (scored + 1) * sizeof(int32_t)
    sizes[B_NODE_KEYS] = (2 * scored + 1) * sizeof(int64_t)
    sizes[B_REQ_CLAIM] = (s.n_reqs + 1) * sizeof(int32_t)
    sizes[B_ALT_CHOICE] = (s.n_reqs + 1) * sizeof(int32_t)
    sizes[B_ORDER] = (s.n_reqs * max_visible + 1) * sizeof(int32_t)
    sizes[B_ORDER_LEN] = (s.n_reqs + 1) * sizeof(int32_t)
    sizes[B_ERR_LAST] = (s.n_reqs + 1) * sizeof(int32_t)
    sizes[B_CLAIM_NRES] = (s.n_claims + 1) * sizeof(int32_t)
    sizes[B_CONS_BASE] = (s.n_cons + 1) * sizeof(int32_t)
    sizes[B_CONS_MEMBERS] = (s.n_cons + 1) * sizeof(int32_t)
    sizes[B_CONS_CNT] = (n_values + 1) * sizeof(int32_t)
    sizes[B_STACK] = (max_depth + 1) * sizeof(Frame)
    sizes[B_STATS] = (s.n_alts * N_STATS_C + 1) * sizeof(int64_t)
    sizes[B_RANK] = (visible + 1) * sizeof(int64_t)
    sizes[B_KEEP] = (visible + 1) * sizeof(double)
    sizes[B_ROOM_ACTIVE] = (rooms + 1) * sizeof(int32_t)
    sizes[B_ROOM_TAKE] = (rooms + 1) * sizeof(int32_t)
    sizes[B_ROOM_SPARE] = (rooms + 1) * sizeof(double)
    sizes[B_ROOM_ONE] = (rooms + 1) * sizeof(double)
    for i in range(N_BUFFERS):
        offsets[i] = total
        total += (<size_t> sizes[i] + BUFFER_ALIGN - 1) // BUFFER_ALIGN * BUFFER_ALIGN
    s.block = PyMem_Malloc(total)
    if s.block == NULL:
        raise MemoryError()
    base = <char*> s.block
    s.node_order = <int32_t*> (base + offsets[B_NODE_ORDER])
    s.node_score = <int32_t*> (base + offsets[B_NODE_SCORE])
    s.node_keys = <int64_t*> (base + offsets[B_NODE_KEYS])
    s.req_claim = <int32_t*> (base + offsets[B_REQ_CLAIM])
    s.alt_choice = <int32_t*> (base + offsets[B_ALT_CHOICE])
    s.order = <int32_t*> (base + offsets[B_ORDER])
    s.order_len = <int32_t*> (base + offsets[B_ORDER_LEN])
    s.err_last = <int32_t*> (base + offsets[B_ERR_LAST])
    s.claim_nres = <int32_t*> (base + offsets[B_CLAIM_NRES])
    s.cons_base = <int32_t*> (base + offsets[B_CONS_BASE])
    s.cons_members = <int32_t*> (base + offsets[B_CONS_MEMBERS])
    s.cons_cnt = <int32_t*> (base + offsets[B_CONS_CNT])
    s.stack = <Frame*> (base + offsets[B_STACK])
    s.stats = <int64_t*> (base + offsets[B_STATS])
    s.rank = <int64_t*> (base + offsets[B_RANK])
    s.keep = <double*> (base + offsets[B_KEEP])
    s.room_active = <int32_t*> (base + offsets[B_ROOM_ACTIVE])
    s.room_take = <int32_t*> (base + offsets[B_ROOM_TAKE])
    s.room_spare = <double*> (base + offsets[B_ROOM_SPARE])
    s.room_one = <double*> (base + offsets[B_ROOM_ONE])
    return 0
