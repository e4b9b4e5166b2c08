"""Node state: prepare and unprepare claims on this node, idempotently and crash-safely.

What it does: for each claim the kubelet names, reads the ResourceClaim (`ClaimSource`),
takes the results for our driver and this node's pool, validates the opaque configs,
checks no other prepared claim holds the devices, records PrepareStarted in the
checkpoint, creates dynamic MIG instances, applies sharing (time-slice, MPS, a share's
memory limit), writes the claim's CDI spec, and records PrepareCompleted with every side
effect; unprepare undoes exactly those; `sweep` removes what no prepared claim owns. All
state changes happen under one lock, and the checkpoint is written before and after the
side effects, so a crash at any point is rolled back on the next attempt. The claim is read
outside the state lock, so prepares of different claims do not wait for each other's API read.
Callers must not overlap calls for one claim (the plugin holds a lock per claim UID around
them): an unprepare during the prepare's read would find nothing to undo, and what the prepare
then makes would leak.

What it must not do: speak gRPC (plugin translates), talk to the API server except through
`ClaimSource`, import `pynvml`, or allocate: it only carries out a claim's allocation.
"""

from __future__ import annotations

import dataclasses
import pathlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import structlog

from dractl import model
from dractl.node import backend, cdi, checkpoint, mig, opaque, sharing

__all__ = [
    "ClaimRef",
    "PreparedDevice",
    "PrepareError",
    "ClaimSource",
    "SweepResult",
    "State",
    "BOOT_ID_PATH",
    "CHECKPOINT_FILE",
]

BOOT_ID_PATH = pathlib.Path("/proc/sys/kernel/random/boot_id")
CHECKPOINT_FILE = "checkpoint.json"
_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_MIB = 2**20

_log = structlog.get_logger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


# What the kubelet gets for a prepared device is what the checkpoint records for it.
PreparedDevice = checkpoint.DeviceRecord


class PrepareError(Exception):
    """A per-claim failure; str() is the message the kubelet shows (names the claim and field)."""


class ClaimSource(Protocol):
    def get_claim(self, namespace: str, name: str) -> model.ResourceClaim | None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class SweepResult:
    """What one sweep removed: claims unprepared (UIDs), CDI files, MIG instances (as
    `gpu-<minor>/gi<id>`), MPS daemons no claim uses. `errors` lists what could not be
    cleaned (retried next sweep)."""

    unprepared: tuple[str, ...] = ()
    removed_cdi_files: tuple[pathlib.Path, ...] = ()
    destroyed_mig: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    stopped_mps: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class _Item:
    """One allocation result of ours, resolved against the node's GPUs."""

    request: str  # as in the result, maybe "req/sub"
    device: str
    share_id: str | None
    admin: bool
    kind: opaque.DeviceKind
    gpu: backend.GpuInfo  # the physical GPU (a MIG device's parent), as read when planning
    uuid: str | None  # None for a dynamic MIG device not created yet
    mig: checkpoint.MigRecord | None  # dynamic MIG (planned or reused) or static MIG (with ids)
    dynamic: bool
    selected: opaque.Selected
    memory_mib: int | None  # a share's consumed memory

    @property
    def minor(self) -> int:
        return self.gpu.minor

    @property
    def base(self) -> str:
        return self.request.split("/", 1)[0]

    @property
    def cdi_device(self) -> str:
        # Two shares of one multi-allocatable device in one claim need two CDI names.
        return f"{self.device}-{self.share_id}" if self.share_id else self.device


def _describe(record: checkpoint.ClaimRecord) -> str:
    return f"{record.namespace}/{record.name}"


class State:
    """The prepared claims of this node. Thread-safe for different claims: every change runs
    under one lock, and the claim read of `prepare` outside it, so different claims do not wait
    for each other's API read. Callers serialize the `prepare` and `unprepare` calls of one claim
    UID (the plugin does); `sweep` may run beside them.

    `dynamic_mig` says whether MIG devices are created at prepare time (DynamicMIG) or
    already exist (static MIG). `device_nodes` says whether CDI specs carry `/dev/nvidia*`
    nodes (off for fake GPUs, whose nodes do not exist on the host). `on_warning` receives
    each warning (a discarded checkpoint) so the agent can turn it into an Event. `fsync`
    (off by default) makes each checkpoint write durable against power loss. It costs about
    8 ms per write here, which would triple a prepare's latency, and buys nothing: a power
    loss changes the boot id, which discards the checkpoint anyway (MIG instances and the CDI
    files in /var/run are gone too), and a process crash keeps the page cache, where the
    rename is atomic.
    """

    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        backend: backend.NvmlBackend,
        claims: ClaimSource,
        cdi_root: pathlib.Path,
        state_dir: pathlib.Path,
        mps: sharing.MpsControl | None = None,
        common_edits: cdi.CommonEdits | None = None,
        dynamic_mig: bool = False,
        device_nodes: bool = True,
        boot_id_path: pathlib.Path = BOOT_ID_PATH,
        proc_root: pathlib.Path = pathlib.Path("/proc"),
        on_warning: Callable[[str], None] | None = None,
        fsync: bool = False,
    ) -> None:
        self._driver = driver_name
        self._node = node_name
        self._gpus = backend
        self._claims = claims
        self._cdi_root = cdi_root
        self._state_dir = state_dir
        self._mps: sharing.MpsControl = mps if mps is not None else sharing.NvidiaMps(root=state_dir / "mps")
        self._common: cdi.CommonEdits = common_edits if common_edits is not None else cdi.NvidiaCtk()
        self._dynamic_mig = dynamic_mig
        self._device_nodes = device_nodes
        self._proc_root = proc_root
        self._on_warning = on_warning
        self._lock = threading.Lock()
        self._writer = checkpoint.Writer(state_dir / CHECKPOINT_FILE, fsync=fsync)
        self.warnings: list[str] = []
        loaded = checkpoint.load(self._writer.path, boot_id=checkpoint.read_boot_id(boot_id_path))
        self._cp = loaded.checkpoint
        if loaded.warning is not None:
            self._warn(loaded.warning)
            # Save the fresh state now so the same warning is not raised on every start.
            self._writer.save(self._cp)

    # --- public API ------------------------------------------------------------------------

    def prepared(self) -> Mapping[str, checkpoint.ClaimRecord]:
        """A snapshot of the checkpoint's records by claim UID (for the agent and tests)."""
        with self._lock:
            return dict(self._cp.claims)

    def prepare(self, claim: ClaimRef) -> tuple[PreparedDevice, ...]:
        """Prepare one claim and return its devices. Idempotent: a completed claim returns
        the same answer without touching anything; an interrupted earlier attempt is rolled
        back first. Raises `PrepareError` naming the claim (and field, for bad input). The caller
        must not run an unprepare of the same claim until this returns."""
        with self._lock:
            done = self._completed(claim)
        if done is not None:
            return done
        # The API read is slow, so it happens outside the state lock. Nothing else of this claim
        # runs meanwhile (the caller serializes its calls), so no unprepare can slip in between
        # the read and the record it leads to.
        resource = self._read_claim(claim)
        with self._lock:
            done = self._completed(claim)
            if done is not None:
                return done
            # The GPU list (minors, UUIDs, MIG modes) is read once here and used for every
            # result and every MIG instance created; nothing else changes it while the lock is held.
            gpus = {gpu.minor: gpu for gpu in self._gpus.gpus()}
            items = self._plan(claim, resource, gpus)
            self._check_conflicts(claim, items)
            previous = self._cp.claims.get(claim.uid)
            if previous is not None:
                _log.info("rolling back an interrupted prepare", claim=f"{claim.namespace}/{claim.name}", uid=claim.uid)
                self._undo_or_raise(previous, what="roll back the interrupted prepare of")
                self._store(None, uid=claim.uid)
            return self._apply(claim, items)

    def unprepare(self, claim: ClaimRef) -> None:
        """Undo everything prepare did for the claim. Unknown claims succeed (idempotent).
        Raises `PrepareError` when a side effect cannot be undone (the record is kept, so the
        kubelet's retry or the next sweep tries again). The caller must not run it while a
        prepare of the same claim is in progress."""
        with self._lock:
            record = self._cp.claims.get(claim.uid)
            if record is None:
                return
            self._undo_or_raise(record, what="unprepare")
            self._store(None, uid=claim.uid)

    def sweep(self) -> SweepResult:
        """Remove stale state: prepared claims whose ResourceClaim is gone or has another UID
        (unprepared), our CDI files with no prepared claim, (dynamic MIG) GPU instances and
        MPS daemons no prepared claim owns. Idempotent; errors are collected, not raised."""
        with self._lock:
            records = list(self._cp.claims.values())
        stale: list[checkpoint.ClaimRecord] = []
        errors: list[str] = []
        for record in records:
            try:
                current = self._claims.get_claim(record.namespace, record.name)
            except Exception as err:  # noqa: BLE001 (an API outage must not stop the sweep)
                errors.append(f"claim {_describe(record)}: cannot read it ({err})")
                continue
            if current is None or current.meta.uid != record.uid:
                stale.append(record)
        unprepared: list[str] = []
        removed: list[pathlib.Path] = []
        destroyed: list[str] = []
        with self._lock:
            for record in stale:
                if self._cp.claims.get(record.uid) != record:
                    continue  # prepared again or unprepared since we looked
                try:
                    self._undo(record)
                except (backend.NvmlError, OSError) as err:
                    errors.append(f"claim {_describe(record)}: cannot unprepare ({err})")
                    continue
                self._store(None, uid=record.uid)
                unprepared.append(record.uid)
            for uid, path in cdi.claim_specs(self._cdi_root).items():
                if uid not in self._cp.claims:
                    cdi.remove_spec(path)
                    removed.append(path)
            if self._dynamic_mig:
                destroyed.extend(self._sweep_mig(errors))
            used = {daemon for record in self._cp.claims.values() for daemon in record.mps_daemons}
            stopped = [daemon for daemon in self._mps.daemons() if daemon not in used]
            for daemon in stopped:
                self._mps.stop(daemon)
        result = SweepResult(tuple(unprepared), tuple(removed), tuple(destroyed), tuple(errors), tuple(stopped))
        if unprepared or removed or destroyed or errors or stopped:
            _log.info(
                "sweep",
                unprepared=result.unprepared,
                removed_cdi_files=[str(p) for p in removed],
                destroyed_mig=destroyed,
                stopped_mps=stopped,
                errors=errors,
            )
        return result

    # --- reading and planning ----------------------------------------------------------------

    def _warn(self, message: str) -> None:
        _log.warning(message)
        self.warnings.append(message)
        if self._on_warning is not None:
            self._on_warning(message)

    def _completed(self, claim: ClaimRef) -> tuple[PreparedDevice, ...] | None:
        record = self._cp.claims.get(claim.uid)
        if record is None or record.phase is not checkpoint.Phase.COMPLETED:
            return None
        return record.devices

    def _read_claim(self, claim: ClaimRef) -> model.ResourceClaim:
        name = f"{claim.namespace}/{claim.name}"
        try:
            resource = self._claims.get_claim(claim.namespace, claim.name)
        except Exception as err:  # noqa: BLE001 (any API failure is this claim's error, not the agent's)
            raise PrepareError(f"claim {name}: cannot read the ResourceClaim: {err}") from None
        if resource is None:
            raise PrepareError(f"claim {name}: ResourceClaim not found")
        if resource.meta.uid != claim.uid:
            raise PrepareError(
                f"claim {name}: UID is {resource.meta.uid or '(none)'}, the kubelet asked for {claim.uid}"
                " (the claim was replaced)"
            )
        if resource.allocation is None:
            raise PrepareError(f"claim {name}: not allocated (status.allocation is empty)")
        return resource

    @staticmethod
    def _gpu(gpus: Mapping[int, backend.GpuInfo], minor: int, *, name: str, device: str) -> backend.GpuInfo:
        gpu = gpus.get(minor)
        if gpu is None:
            raise PrepareError(f"claim {name}: device {device}: this node has no GPU with minor {minor}")
        return gpu

    def _other_mig(self, uid: str, device: str) -> checkpoint.MigRecord | None:
        """A created MIG instance another claim already prepared for the same (shared) device."""
        for record in self._cp.claims.values():
            if record.uid == uid or record.phase is not checkpoint.Phase.COMPLETED:
                continue
            for m in record.mig:
                if m.device == device and m.uuid is not None:
                    return m
        return None

    def _resolve(
        self, claim: ClaimRef, result: model.DeviceRequestAllocationResult, gpus: Mapping[int, backend.GpuInfo]
    ) -> tuple[opaque.DeviceKind, backend.GpuInfo, str | None, checkpoint.MigRecord | None, bool]:
        name = f"{claim.namespace}/{claim.name}"
        where = f"claim {name}: status.allocation.devices.results device {result.device}"
        parsed = mig.parse_name(result.device)
        if parsed is None:
            if not result.device.startswith("gpu-") or not result.device[4:].isdigit():
                raise PrepareError(
                    f"{where}: not a device this driver publishes (expected gpu-<minor> or a MIG device name)"
                )
            gpu = self._gpu(gpus, int(result.device[4:]), name=name, device=result.device)
            if gpu.mig_mode is backend.MigMode.ENABLED and not self._dynamic_mig:
                raise PrepareError(f"{where}: GPU {gpu.minor} has MIG mode enabled, so it cannot be used whole")
            return opaque.DeviceKind.GPU, gpu, gpu.uuid, None, False
        gpu = self._gpu(gpus, parsed.parent_minor, name=name, device=result.device)
        if not self._dynamic_mig:
            existing = mig.existing_device(self._gpus, parsed)
            if existing is None:
                raise PrepareError(
                    f"{where}: no such MIG device exists on GPU {gpu.minor} (was it deleted out of band?)"
                )
            record = checkpoint.MigRecord(
                device=result.device,
                parent_minor=gpu.minor,
                parent_uuid=gpu.uuid,
                profile_id=existing.profile_id,
                start=existing.placement.start,
                size=existing.placement.size,
                gi_id=existing.gi_id,
                ci_id=existing.ci_id,
                uuid=existing.uuid,
            )
            return opaque.DeviceKind.MIG, gpu, existing.uuid, record, False
        shared = self._other_mig(claim.uid, result.device)
        if shared is not None:
            return opaque.DeviceKind.MIG, gpu, shared.uuid, shared, False
        try:
            placement = mig.placement_of(self._gpus, parsed)
        except (ValueError, backend.NvmlError) as err:
            raise PrepareError(f"{where}: {err}") from None
        planned = checkpoint.MigRecord(
            device=result.device,
            parent_minor=gpu.minor,
            parent_uuid=gpu.uuid,
            profile_id=parsed.profile_id,
            start=placement.start,
            size=placement.size,
        )
        return opaque.DeviceKind.MIG, gpu, None, planned, True

    def _plan(
        self, claim: ClaimRef, resource: model.ResourceClaim, gpus: Mapping[int, backend.GpuInfo]
    ) -> tuple[_Item, ...]:
        assert resource.allocation is not None  # checked by _read_claim
        name = f"{claim.namespace}/{claim.name}"
        ours = [r for r in resource.allocation.results if r.driver == self._driver and r.pool == self._node]
        for r in resource.allocation.results:
            if r.driver == self._driver and r.pool != self._node:
                _log.warning("ignoring a result for another pool", claim=name, pool=r.pool, device=r.device)
        resolved = [self._resolve(claim, r, gpus) for r in ours]
        try:
            selected = opaque.select(
                resource.allocation.config,
                driver=self._driver,
                results=[(r.request, k[0]) for r, k in zip(ours, resolved, strict=True)],
            )
        except opaque.ConfigError as err:
            raise PrepareError(self._config_message(name, resource, err)) from None
        items = []
        for result, (kind, gpu, uuid, mig_record, dynamic), chosen in zip(ours, resolved, selected, strict=True):
            memory = result.consumed_capacity.get("memory")
            items.append(
                _Item(
                    request=result.request,
                    device=result.device,
                    share_id=result.share_id,
                    admin=bool(result.admin_access),
                    kind=kind,
                    gpu=gpu,
                    uuid=uuid,
                    mig=mig_record,
                    dynamic=dynamic,
                    selected=chosen,
                    memory_mib=None if memory is None or result.share_id is None else max(1, int(memory.value // _MIB)),
                )
            )
        self._check_sharing(name, resource, items)
        return tuple(items)

    def _config_message(self, name: str, resource: model.ResourceClaim, err: opaque.ConfigError) -> str:
        assert resource.allocation is not None
        if err.index is None:
            return f"claim {name}: opaque config: {err}"
        source = resource.allocation.config[err.index].source
        field = f".{err.field}" if err.field else ""
        where = f"status.allocation.devices.config[{err.index}] ({source}) opaque.parameters{field}"
        return f"claim {name}: {where}: {err.message}"

    def _check_sharing(self, name: str, resource: model.ResourceClaim, items: Sequence[_Item]) -> None:
        for item in items:
            sharing_config = item.selected.config.sharing
            if sharing_config is None or sharing_config.mps is None or item.selected.index is None:
                continue
            group = [i for i in items if i.selected.index == item.selected.index]
            keys = set(sharing_config.mps.per_device_pinned_memory_limit_mib)
            known = {str(n) for n in range(len(group))} | {i.uuid for i in group if i.uuid}
            unknown = sorted(keys - known)
            if unknown:
                err = opaque.ConfigError(
                    "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit",
                    f"{unknown[0]!r} is neither the UUID nor the index (0-{len(group) - 1})"
                    " of a device this config applies to",
                    index=item.selected.index,
                )
                raise PrepareError(self._config_message(name, resource, err))

    def _check_conflicts(self, claim: ClaimRef, items: Sequence[_Item]) -> None:
        """Refuse a non-admin device another prepared claim holds, unless both hold it as
        shares of a multi-allocatable device (a share has a shareID)."""
        for item in items:
            if item.admin:
                continue
            for record in self._cp.claims.values():
                if record.uid == claim.uid:
                    continue
                held_whole = item.device in record.exclusive
                if held_whole or (item.share_id is None and item.device in record.shared):
                    raise PrepareError(
                        f"claim {claim.namespace}/{claim.name}: device {item.device} is already prepared for claim "
                        f"{_describe(record)} (uid {record.uid}); it cannot be used by two claims at once"
                    )

    # --- applying and undoing ----------------------------------------------------------------

    def _store(self, record: checkpoint.ClaimRecord | None, *, uid: str) -> None:
        claims = dict(self._cp.claims)
        if record is None:
            claims.pop(uid, None)
        else:
            claims[uid] = record
        updated = checkpoint.Checkpoint(boot_id=self._cp.boot_id, claims=claims)
        self._writer.save(updated)
        self._cp = updated

    def _mps_groups(
        self, claim: ClaimRef, items: Sequence[_Item]
    ) -> tuple[dict[int, str], dict[str, sharing.MpsSettings]]:
        """Which MPS daemon each item uses (by item position) and each daemon's settings.

        Whole devices under an MPS config get a daemon per claim and config, as the NVIDIA
        driver does. Shares of a multi-allocatable GPU (MPS config or a consumed memory
        amount to enforce) use one daemon per physical device shared by every claim, with
        the limits applied per client through environment variables.
        """
        by_item: dict[int, str] = {}
        daemons: dict[str, sharing.MpsSettings] = {}
        groups: dict[int, list[int]] = {}
        for position, item in enumerate(items):
            config = item.selected.config.sharing
            if item.admin:
                continue
            if item.share_id is not None and (
                item.memory_mib is not None or (config is not None and config.mps is not None)
            ):
                assert item.uuid is not None
                daemon = f"shared-{item.uuid}"
                by_item[position] = daemon
                daemons[daemon] = sharing.MpsSettings(daemon_id=daemon, uuids=(item.uuid,))
            elif config is not None and config.mps is not None and item.selected.index is not None:
                groups.setdefault(item.selected.index, []).append(position)
        for positions in groups.values():
            uuids = tuple(items[p].uuid or "" for p in positions)
            daemon = sharing.daemon_id(claim.uid, uuids)
            config = items[positions[0]].selected.config.sharing
            assert config is not None and config.mps is not None
            limits: dict[str, int] = {}
            for n, uuid in enumerate(uuids):
                per_device = config.mps.per_device_pinned_memory_limit_mib
                limit = per_device.get(uuid, per_device.get(str(n), config.mps.default_pinned_memory_limit_mib))
                if limit is not None:
                    limits[uuid] = limit
            daemons[daemon] = sharing.MpsSettings(
                daemon_id=daemon,
                uuids=uuids,
                active_thread_percentage=config.mps.default_active_thread_percentage,
                pinned_limits_mib=limits,
                multi_user=config.mps.multi_user,
            )
            for p in positions:
                by_item[p] = daemon
        return by_item, daemons

    def _apply(self, claim: ClaimRef, items: tuple[_Item, ...]) -> tuple[PreparedDevice, ...]:
        time_slices = {
            i.minor: i.selected.config.sharing.interval
            for i in items
            if not i.admin
            and i.kind is opaque.DeviceKind.GPU
            and i.selected.config.sharing is not None
            and i.selected.config.sharing.interval is not None
        }
        compute_minors = tuple(
            sorted(
                {
                    i.minor
                    for i in items
                    if not i.admin
                    and i.kind is opaque.DeviceKind.GPU
                    and i.share_id is None
                    and i.selected.config.sharing is not None
                    and i.selected.config.sharing.mps is not None
                }
            )
        )
        started = checkpoint.ClaimRecord(
            uid=claim.uid,
            namespace=claim.namespace,
            name=claim.name,
            phase=checkpoint.Phase.STARTED,
            cdi_spec=str(cdi.spec_path(self._cdi_root, claim.uid)),
            mig=tuple(i.mig for i in items if i.mig is not None and (i.dynamic or self._dynamic_mig)),
            time_slices=time_slices,
            compute_minors=compute_minors,
            exclusive=tuple(sorted({i.device for i in items if not i.admin and i.share_id is None})),
            shared=tuple(sorted({i.device for i in items if not i.admin and i.share_id is not None})),
        )
        # Written before any side effect: a crash from here on leaves a record to roll back.
        self._store(started, uid=claim.uid)
        try:
            return self._side_effects(claim, items, started)
        except (backend.NvmlError, OSError, ValueError, PrepareError) as err:
            try:
                self._undo(self._cp.claims[claim.uid])
                self._store(None, uid=claim.uid)
            except (backend.NvmlError, OSError) as undo_err:
                _log.error(
                    "rollback failed; kept PrepareStarted for the next attempt", uid=claim.uid, error=str(undo_err)
                )
            if isinstance(err, PrepareError):
                raise
            raise PrepareError(f"claim {claim.namespace}/{claim.name}: prepare failed: {err}") from None

    def _side_effects(
        self, claim: ClaimRef, items: tuple[_Item, ...], started: checkpoint.ClaimRecord
    ) -> tuple[PreparedDevice, ...]:
        created: list[checkpoint.MigRecord] = []
        resolved: list[_Item] = []
        # The MIG modes read when planning, kept current as instances are made (the first one
        # on a GPU turns MIG on), so creating them reads no GPU list again.
        mig_modes = {item.minor: item.gpu.mig_mode for item in items}
        for item in items:
            if item.dynamic and item.mig is not None:
                m = item.mig
                device = mig.create(
                    self._gpus,
                    minor=m.parent_minor,
                    mig_mode=mig_modes[m.parent_minor],
                    profile_id=m.profile_id,
                    placement=backend.Placement(m.start, m.size),
                )
                mig_modes[m.parent_minor] = backend.MigMode.ENABLED
                made = dataclasses.replace(m, gi_id=device.gi_id, ci_id=device.ci_id, uuid=device.uuid)
                created.append(made)
                # Not recorded yet: PrepareStarted already holds the placement, which is all a
                # rollback needs (mig.destroy_at), so no checkpoint write is spent per instance.
                item = dataclasses.replace(item, uuid=device.uuid, mig=made)
            elif item.kind is opaque.DeviceKind.GPU and self._dynamic_mig and not item.admin:
                self._ensure_whole(claim, item)
            resolved.append(item)
        for minor, interval in sorted(started.time_slices.items()):
            sharing.set_time_slice(self._gpus, minor=minor, interval=interval)
        by_item, daemons = self._mps_groups(claim, resolved)
        for minor in started.compute_minors:
            self._gpus.set_compute_mode(minor, backend.ComputeMode.EXCLUSIVE_PROCESS)
        record = dataclasses.replace(
            started, mig=self._merge_mig(started.mig, created), mps_daemons=tuple(sorted(daemons))
        )
        if daemons:
            # Daemon ids hash the devices' UUIDs, which dynamic MIG only knows now: record them
            # before starting, so a crash from here on stops them on rollback.
            self._store(record, uid=claim.uid)
        for settings in daemons.values():
            self._mps.start(settings)
        prepared = self._write_cdi(claim, resolved, by_item)
        self._store(dataclasses.replace(record, phase=checkpoint.Phase.COMPLETED, devices=prepared), uid=claim.uid)
        return prepared

    @staticmethod
    def _merge_mig(
        planned: Iterable[checkpoint.MigRecord], created: Sequence[checkpoint.MigRecord]
    ) -> tuple[checkpoint.MigRecord, ...]:
        done = {m.device: m for m in created}
        return tuple(done.get(m.device, m) for m in planned)

    def _ensure_whole(self, claim: ClaimRef, item: _Item) -> None:
        """Dynamic MIG: a GPU prepared whole must have MIG off (Hopper can toggle it). Setting
        the mode again is harmless, so the mode read when planning is good enough."""
        name = f"{claim.namespace}/{claim.name}"
        if item.gpu.mig_mode is backend.MigMode.ENABLED:
            if self._gpus.gpu_instances(item.minor):
                raise PrepareError(
                    f"claim {name}: device {item.device}: GPU {item.minor} still has MIG instances,"
                    " so it cannot be used whole"
                )
            self._gpus.set_mig_mode(item.minor, backend.MigMode.DISABLED)

    def _device_edits(self, item: _Item) -> cdi.ContainerEdits:
        if not self._device_nodes:
            return cdi.ContainerEdits()
        nodes = [cdi.device_node(f"/dev/nvidia{item.minor}")]
        if (
            item.kind is opaque.DeviceKind.MIG
            and item.mig is not None
            and item.mig.gi_id is not None
            and item.mig.ci_id is not None
        ):
            for cap in mig.cap_minors(
                self._proc_root, parent_minor=item.minor, gi_id=item.mig.gi_id, ci_id=item.mig.ci_id
            ):
                nodes.append(cdi.device_node(f"/dev/nvidia-caps/nvidia-cap{cap}"))
        return cdi.ContainerEdits(device_nodes=tuple(nodes))

    def _write_cdi(
        self, claim: ClaimRef, items: Sequence[_Item], by_item: Mapping[int, str]
    ) -> tuple[PreparedDevice, ...]:
        # A container gets the devices of the requests it names (or all of them), and CDI
        # env edits are last-wins, so each device carries the UUIDs of its whole request.
        groups: dict[str, list[int]] = {}
        for position, item in enumerate(items):
            groups.setdefault(item.base, []).append(position)
        specs: list[tuple[str, cdi.ContainerEdits]] = []
        prepared: dict[tuple[str, str | None], PreparedDevice] = {}
        for position, item in enumerate(items):
            group = groups[item.base]
            uuids = [items[p].uuid or "" for p in group]
            env = [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}", f"CUDA_VISIBLE_DEVICES={','.join(uuids)}"]
            limits = [f"{n}={items[p].memory_mib}M" for n, p in enumerate(group) if items[p].memory_mib is not None]
            if limits:
                env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(limits)}")
            config = item.selected.config.sharing
            if item.share_id is not None and config is not None and config.mps is not None:
                if config.mps.default_active_thread_percentage is not None:
                    env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={config.mps.default_active_thread_percentage}")
            edits = self._device_edits(item).merged(cdi.ContainerEdits(env=tuple(env)))
            if position in by_item:
                edits = edits.merged(self._mps.workload_edits(by_item[position]))
            key = (item.device, item.share_id)
            if key in prepared:
                known = prepared[key]
                if item.base not in known.requests:
                    prepared[key] = dataclasses.replace(known, requests=(*known.requests, item.base))
                continue
            specs.append((item.cdi_device, edits))
            prepared[key] = PreparedDevice(
                requests=(item.base,),
                pool=self._node,
                device=item.device,
                cdi_device_ids=(cdi.qualified_name(claim.uid, item.cdi_device),),
                share_id=item.share_id,
            )
        common = (
            cdi.ContainerEdits(device_nodes=tuple(cdi.device_node(p) for p in _CONTROL_NODES))
            if self._device_nodes
            else cdi.ContainerEdits()
        )
        common = self._common.common_edits().merged(common)
        if specs:
            cdi.write_spec(self._cdi_root, claim.uid, cdi.build_spec(claim_uid=claim.uid, devices=specs, common=common))
        return tuple(prepared.values())

    def _undo_or_raise(self, record: checkpoint.ClaimRecord, *, what: str) -> None:
        try:
            self._undo(record)
        except (backend.NvmlError, OSError) as err:
            raise PrepareError(f"claim {_describe(record)}: cannot {what} it: {err}") from None

    def _undo(self, record: checkpoint.ClaimRecord) -> None:
        """Undo a record's side effects, keeping what other claims still use. Idempotent."""
        others = [r for r in self._cp.claims.values() if r.uid != record.uid]
        if record.cdi_spec:
            cdi.remove_spec(pathlib.Path(record.cdi_spec))
        still_mps = {d for r in others for d in r.mps_daemons}
        for daemon in record.mps_daemons:
            if daemon not in still_mps:
                self._mps.stop(daemon)
        still_exclusive = {m for r in others for m in r.compute_minors}
        for minor in record.compute_minors:
            if minor not in still_exclusive:
                self._gpus.set_compute_mode(minor, backend.ComputeMode.DEFAULT)
        still_sliced = {m for r in others for m in r.time_slices}
        for minor in record.time_slices:
            if minor not in still_sliced:
                sharing.reset_time_slice(self._gpus, minor=minor)
        if self._dynamic_mig:
            still_mig = {m.device for r in others for m in r.mig}
            for m in record.mig:
                if m.device not in still_mig:
                    mig.destroy_at(
                        self._gpus,
                        minor=m.parent_minor,
                        profile_id=m.profile_id,
                        placement=backend.Placement(m.start, m.size),
                    )

    def _sweep_mig(self, errors: list[str]) -> list[str]:
        owned = {(m.parent_minor, m.profile_id, m.start, m.size) for r in self._cp.claims.values() for m in r.mig}
        destroyed = []
        for gpu in self._gpus.gpus():
            if gpu.mig_mode is not backend.MigMode.ENABLED:
                continue
            try:
                for gi in self._gpus.gpu_instances(gpu.minor):
                    if (gpu.minor, gi.profile_id, gi.placement.start, gi.placement.size) not in owned:
                        mig.destroy(self._gpus, minor=gpu.minor, gi_id=gi.gi_id)
                        destroyed.append(f"gpu-{gpu.minor}/gi{gi.gi_id}")
            except backend.NvmlError as err:
                errors.append(f"GPU {gpu.minor}: cannot sweep MIG instances ({err})")
        return destroyed
