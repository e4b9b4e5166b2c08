"""Node state: prepare and unprepare claims on this node, idempotently and crash-safely.

What it does: for each claim the kubelet names, reads the ResourceClaim (`ClaimSource`),
takes the results for our driver (all of them must be in this node's pool), validates the
opaque configs, checks no other prepared claim holds the devices, records PrepareStarted in the
checkpoint, creates dynamic MIG instances, applies sharing (time-slice, MPS, a share's
memory limit), writes the claim's CDI spec, and records PrepareCompleted with every side
effect; unprepare undoes exactly those; `sweep` removes what no prepared claim owns. All
state changes happen under one lock, and the checkpoint is written before and after the
side effects, so a crash at any point is rolled back on the next attempt. The checkpoint also
holds each claim's CDI devices, so a spec gone from the CDI directory is written again by the
next prepare of that claim and by the sweep (the agent's first one included). The claim is read
outside the state lock, so prepares of different claims do not wait for each other's API read.
Callers must not overlap calls for one claim (the plugin holds a lock per claim UID around
them): an unprepare during the prepare's read would find nothing to undo, and what the prepare
then makes would leak.

The lock is also a file lock in the state directory, and the checkpoint is read again whenever
another process replaced it, so two agents on one node (a rolling update) share one state.
When there is no trustworthy checkpoint (none, or a corrupt one) the state is rebuilt before it
is used: from the claims the API says are allocated in this node's pool and reserved for pods
bound to this node, and the CDI specs and MIG instances that exist; until that succeeds the
sweep removes nothing and a call fails with a retryable error. A checkpoint of a newer agent is
never written over.

What it must not do: speak gRPC (plugin translates), talk to the API server except through
`ClaimSource`, import `pynvml`, or allocate: it only carries out a claim's allocation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import structlog

from dractl import model
from dractl.model import opaque
from dractl.node import backend, cdi, checkpoint, mig, sharing, visibility

__all__ = [
    "ClaimRef",
    "PreparedDevice",
    "PrepareError",
    "ClaimSource",
    "Notice",
    "SweepResult",
    "State",
    "BOOT_ID_PATH",
    "CHECKPOINT_FILE",
    "LOCK_FILE",
]

BOOT_ID_PATH = pathlib.Path("/proc/sys/kernel/random/boot_id")
CHECKPOINT_FILE = "checkpoint.json"
LOCK_FILE = "state.lock"
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

    def claims_on_node(self, *, driver: str, node: str) -> Sequence[model.ResourceClaim]:
        """The claims with a result of `driver` in pool `node` that are reserved for a pod bound to node
        `node`: those the kubelet there has prepared or is about to. Raises when the API cannot say."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class Notice:
    """Something an operator must hear of, as a Warning Event on the Node: `reason` is the Event's reason."""

    reason: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class SweepResult:
    """What one sweep removed: claims unprepared (UIDs), CDI files, MIG instances (as
    `gpu-<minor>/gi<id>`), MPS daemons no claim uses; and the CDI files of prepared claims it
    wrote again because they were gone. `errors` lists what could not be cleaned or written
    (retried next sweep)."""

    unprepared: tuple[str, ...] = ()
    removed_cdi_files: tuple[pathlib.Path, ...] = ()
    destroyed_mig: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    stopped_mps: tuple[str, ...] = ()
    restored_cdi_files: tuple[pathlib.Path, ...] = ()


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


def _pods(resource: model.ResourceClaim) -> str:
    """` (pod ns/a, ns/b)`: the pods a claim is reserved for, as a message names them (another consumer, such as a
    PodGroup, by its resource: `podgroups ns/train`); empty when none."""
    pods = [f"{resource.meta.namespace}/{ref.name}" for ref in resource.reserved_for if ref.resource == "pods"]
    others = [
        f"{ref.resource} {resource.meta.namespace}/{ref.name}"
        for ref in resource.reserved_for
        if ref.resource != "pods"
    ]
    named = ([f"{'pod' if len(pods) == 1 else 'pods'} {', '.join(pods)}"] if pods else []) + others
    return f" ({', '.join(named)})" if named else ""


def _listed(names: Sequence[str]) -> str:
    return f" ({', '.join(names)})" if names else ""


class State:
    """The prepared claims of this node. Thread-safe for different claims: every change runs
    under one lock, and the claim read of `prepare` outside it, so different claims do not wait
    for each other's API read. Callers serialize the `prepare` and `unprepare` calls of one claim
    UID (the plugin does); `sweep` may run beside them. Several processes may hold a State on the
    same directories (a rolling update): the lock is also a `checkpoint.FileLock` on
    `<state_dir>/state.lock`, and under it the checkpoint is read again whenever another process
    replaced it.

    `dynamic_mig` says whether MIG devices are created at prepare time (DynamicMIG) or
    already exist (static MIG). `device_nodes` says whether CDI specs carry `/dev/nvidia*`
    nodes (off for fake GPUs, whose nodes do not exist on the host). `on_warning` receives
    each `Notice` (a discarded or rebuilt checkpoint) so the agent can turn it into an Event.
    `fsync` (off by default) makes each checkpoint write durable against power loss. It costs
    about 8 ms per write here, which would triple a prepare's latency, and buys nothing: a power
    loss changes the boot id, which discards the checkpoint anyway (MIG instances and the CDI
    files in /var/run are gone too), and a process crash keeps the page cache, where the
    rename is atomic.

    Construction reads the checkpoint and raises `checkpoint.NewerVersion` (touching nothing) when
    a newer agent wrote it. With no checkpoint or a corrupt one, the rebuild runs at the first
    `sweep`, `prepare` or `unprepare`, and at each later one until it succeeds.
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
        on_warning: Callable[[Notice], None] | None = None,
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
        self._file_lock = checkpoint.FileLock(state_dir / LOCK_FILE)
        self._writer = checkpoint.Writer(state_dir / CHECKPOINT_FILE, fsync=fsync)
        self._boot_id = checkpoint.read_boot_id(boot_id_path)
        self._cp = checkpoint.Checkpoint(boot_id=self._boot_id)
        # Why the state must be rebuilt before it is used (no checkpoint, or a corrupt one); None once it is not.
        self._rebuild_reason: str | None = None
        with self._lock, self._file_lock.held():
            self._adopt(self._writer.read(boot_id=self._boot_id))

    # --- public API ------------------------------------------------------------------------

    def prepared(self) -> Mapping[str, checkpoint.ClaimRecord]:
        """A snapshot of the checkpoint's records by claim UID (for the agent and tests)."""
        with self._locked():
            return dict(self._cp.claims)

    def prepare(self, claim: ClaimRef) -> tuple[PreparedDevice, ...]:
        """Prepare one claim and return its devices. Idempotent: a completed claim returns
        the same answer without touching anything; an interrupted earlier attempt is rolled
        back first. Raises `PrepareError` naming the claim (and field, for bad input). The caller
        must not run an unprepare of the same claim until this returns."""
        with self._locked(claim):
            done = self._completed(claim)
        if done is not None:
            return done
        # The API read is slow, so it happens outside the state lock. Nothing else of this claim
        # runs meanwhile (the caller serializes its calls), so no unprepare can slip in between
        # the read and the record it leads to.
        resource = self._read_claim(claim)
        with self._locked(claim):
            done = self._completed(claim)
            if done is not None:
                return done
            # The GPU list (minors, UUIDs, MIG modes) is read once here and used for every
            # result and every MIG instance created; nothing else changes it while the lock is held.
            gpus = {gpu.minor: gpu for gpu in self._gpus.gpus()}
            items = self._plan(claim, resource, gpus)
            conflict = self._conflict(claim, items)
            if conflict is None:
                previous = self._cp.claims.get(claim.uid)
                if previous is not None:
                    _log.info(
                        "rolling back an interrupted prepare", claim=f"{claim.namespace}/{claim.name}", uid=claim.uid
                    )
                    self._undo_or_raise(previous, what="roll back the interrupted prepare of")
                    self._store(None, uid=claim.uid)
                return self._apply(claim, items)
        # Refused; the holder's pods are read outside the lock, so other claims need not wait for that read.
        device, holder = conflict
        raise PrepareError(
            f"claim {claim.namespace}/{claim.name}{_pods(resource)}: device {device} is already prepared for claim "
            f"{_describe(holder)} (uid {holder.uid}){self._holder_pods(holder)}; it cannot be used by two claims at "
            "once (were they allocated by two schedulers?)"
        )

    def unprepare(self, claim: ClaimRef) -> None:
        """Undo everything prepare did for the claim. Unknown claims succeed (idempotent).
        Raises `PrepareError` when a side effect cannot be undone (the record is kept, so the
        kubelet's retry or the next sweep tries again). The caller must not run it while a
        prepare of the same claim is in progress."""
        with self._locked(claim):
            record = self._cp.claims.get(claim.uid)
            if record is None:
                return
            self._undo_or_raise(record, what="unprepare")
            self._store(None, uid=claim.uid)

    def sweep(self) -> SweepResult:
        """Remove stale state: prepared claims whose ResourceClaim is gone or has another UID
        (unprepared), our CDI files with no prepared claim, (dynamic MIG) GPU instances and
        MPS daemons no prepared claim owns; write again the CDI spec of a prepared claim that is
        gone. Rebuilds the state first when it must be; while that fails it removes nothing.
        Idempotent; errors are collected, not raised."""
        try:
            with self._locked():
                records = list(self._cp.claims.values())
        except PrepareError as err:
            return SweepResult(errors=(str(err),))
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
        stopped: list[str] = []
        restored: tuple[pathlib.Path, ...] = ()
        try:
            with self._locked():
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
                restored = self._restore_specs(errors)
        except PrepareError as err:
            errors.append(str(err))
        result = SweepResult(
            unprepared=tuple(unprepared),
            removed_cdi_files=tuple(removed),
            destroyed_mig=tuple(destroyed),
            errors=tuple(errors),
            stopped_mps=tuple(stopped),
            restored_cdi_files=restored,
        )
        if unprepared or removed or destroyed or errors or stopped or restored:
            _log.info(
                "sweep",
                unprepared=result.unprepared,
                removed_cdi_files=[str(p) for p in removed],
                restored_cdi_files=[str(p) for p in restored],
                destroyed_mig=destroyed,
                stopped_mps=stopped,
                errors=errors,
            )
        return result

    def restore_specs(self) -> SweepResult:
        """Write again, from the checkpoint, the CDI spec of every prepared claim whose spec is gone from the CDI
        directory (cleaned by hand, a tmpfs emptied), so a container of it that starts or restarts finds its
        devices. Cheap when none is gone: one stat per prepared claim. Idempotent; errors are collected."""
        errors: list[str] = []
        try:
            with self._locked():
                restored = self._restore_specs(errors)
        except PrepareError as err:
            return SweepResult(errors=(str(err),))
        return SweepResult(restored_cdi_files=restored, errors=tuple(errors))

    # --- the checkpoint, shared with other processes, and its rebuild ---------------------------

    @contextlib.contextmanager
    def _locked(self, claim: ClaimRef | None = None) -> Iterator[None]:
        """Hold the state lock and the file lock; adopt the checkpoint another process wrote meanwhile,
        and rebuild the state first when it must be. Raises PrepareError (naming `claim` when given)
        when the state cannot be used: a newer agent's checkpoint, or a rebuild that failed."""
        who = f"claim {claim.namespace}/{claim.name}: " if claim is not None else ""
        with self._lock, self._file_lock.held():
            try:
                if self._writer.changed():
                    self._adopt(self._writer.read(boot_id=self._boot_id))
            except checkpoint.NewerVersion as err:
                raise PrepareError(
                    f"{who}{err}, so it leaves the node to the newer one (the kubelet calls the newest plugin)"
                ) from None
            if self._rebuild_reason is not None:
                self._rebuild(who)
            yield

    def _adopt(self, loaded: checkpoint.Loaded) -> None:
        """Take what the checkpoint file held as the state (under the locks)."""
        self._cp = loaded.checkpoint
        self._rebuild_reason = None
        if loaded.found is checkpoint.Found.OTHER_BOOT:
            assert loaded.warning is not None
            self._notify(Notice(reason="NodeStateReset", message=loaded.warning))
            # Save the fresh state now so the same warning is not raised on every start.
            self._writer.save(self._cp)
        elif loaded.found is checkpoint.Found.CORRUPT:
            assert loaded.warning is not None
            _log.warning(f"{loaded.warning}; rebuilding the prepared claims from the API and the devices")
            self._rebuild_reason = loaded.warning
        elif loaded.found is checkpoint.Found.ABSENT:
            self._rebuild_reason = f"there was no checkpoint at {self._writer.path}"
        elif loaded.found is checkpoint.Found.OLDER:
            _log.info(
                "checkpoint of an older version read; it is written in this version at the next change",
                path=str(self._writer.path),
                version=loaded.version,
                current=checkpoint.VERSION,
                claims=len(loaded.checkpoint.claims),
            )

    def _rebuild(self, who: str) -> None:
        """Rebuild the records from the claims the API says are prepared or being prepared here, the CDI
        specs and the MIG instances that exist, and save them. Under the locks. Raises PrepareError when the
        API cannot say; the next call tries again."""
        assert self._rebuild_reason is not None
        try:
            resources = self._claims.claims_on_node(driver=self._driver, node=self._node)
        except Exception as err:  # noqa: BLE001 (an API outage or a bad object: retried, never fatal)
            _log.warning(
                "cannot rebuild the node's prepared claims yet; retrying", reason=self._rebuild_reason, error=str(err)
            )
            raise PrepareError(
                f"{who}the node's prepared claims must be rebuilt ({self._rebuild_reason}) but the claims on this "
                f"node cannot be read: {err}; the kubelet retries"
            ) from None
        gpus = {gpu.minor: gpu for gpu in self._gpus.gpus()}
        specs = cdi.claim_specs(self._cdi_root)
        problems: list[str] = []
        for resource in sorted(resources, key=lambda r: (r.meta.namespace, r.meta.name)):
            ref = ClaimRef(namespace=resource.meta.namespace, name=resource.meta.name, uid=resource.meta.uid)
            has_spec = ref.uid in specs
            try:
                record = self._rebuilt_record(ref, resource, gpus, has_spec=has_spec)
            except PrepareError as err:
                if not has_spec:
                    continue  # nothing of it exists here to keep
                # Kept with its CDI spec only, so the sweep leaves the spec and unprepare removes it.
                problems.append(str(err))
                record = checkpoint.ClaimRecord(
                    uid=ref.uid,
                    namespace=ref.namespace,
                    name=ref.name,
                    phase=checkpoint.Phase.STARTED,
                    cdi_spec=str(cdi.spec_path(self._cdi_root, ref.uid)),
                )
            if record is None:
                continue
            # Stored one by one: a later claim sharing a MIG device finds the instance an earlier one holds.
            self._cp = checkpoint.Checkpoint(boot_id=self._cp.boot_id, claims={**self._cp.claims, ref.uid: record})
        self._writer.save(self._cp)
        reason, self._rebuild_reason = self._rebuild_reason, None
        records = sorted(self._cp.claims.values(), key=lambda r: (r.namespace, r.name))
        completed = [_describe(r) for r in records if r.phase is checkpoint.Phase.COMPLETED]
        started = [_describe(r) for r in records if r.phase is checkpoint.Phase.STARTED]
        _log.info("rebuilt the node's prepared claims", reason=reason, completed=completed, started=started)
        if records or problems or not reason.startswith("there was no checkpoint"):
            message = (
                f"{reason}; rebuilt from the API and the devices: {len(completed)} prepared claim(s)"
                f"{_listed(completed)}, {len(started)} to roll back or finish{_listed(started)}"
                + "".join(f"; {problem}" for problem in problems)
            )
            self._notify(Notice(reason="CheckpointRebuilt", message=message))

    def _rebuilt_record(
        self, claim: ClaimRef, resource: model.ResourceClaim, gpus: Mapping[int, backend.GpuInfo], *, has_spec: bool
    ) -> checkpoint.ClaimRecord | None:
        """The record a prepare of this claim left: PrepareCompleted when its CDI spec and every dynamic MIG
        instance exist; PrepareStarted when only some of them do (with all it may have made, so the next prepare
        rolls it back and unprepare undoes it); None when none does (not prepared yet: nothing to keep). Raises
        PrepareError when the claim cannot be planned here any more."""
        items = self._plan(claim, resource, gpus)
        started = self._started_record(claim, items)
        complete = has_spec
        resolved: list[_Item] = []
        made: list[checkpoint.MigRecord] = []
        for item in items:
            if item.dynamic and item.mig is not None:
                m = item.mig
                try:
                    device = mig.existing_at(
                        self._gpus,
                        minor=m.parent_minor,
                        profile_id=m.profile_id,
                        placement=backend.Placement(m.start, m.size),
                    )
                except backend.NvmlError:
                    device = None
                if device is None:
                    complete = False
                else:
                    m = dataclasses.replace(m, gi_id=device.gi_id, ci_id=device.ci_id, uuid=device.uuid)
                    made.append(m)
                    item = dataclasses.replace(item, uuid=device.uuid, mig=m)
            resolved.append(item)
        record = dataclasses.replace(started, mig=self._merge_mig(started.mig, made))
        if not complete:
            # A GPU instance without its compute instance is something it made too.
            return record if has_spec or any(self._instance_left(m) for m in record.mig) else None
        by_item, daemons = self._mps_groups(claim, resolved)
        plan = self._visibility(claim, resolved, by_item)
        return dataclasses.replace(
            record,
            phase=checkpoint.Phase.COMPLETED,
            devices=plan.prepared,
            mps_daemons=tuple(sorted(daemons)),
            cdi_devices=cdi.device_entries(claim_uid=claim.uid, devices=plan.entries),
        )

    def _instance_left(self, m: checkpoint.MigRecord) -> bool:
        """Whether a GPU instance sits at the record's placement; True when NVML cannot say, so the record and
        the placement it owns are kept rather than swept on a guess."""
        try:
            return bool(
                mig.find(
                    self._gpus,
                    minor=m.parent_minor,
                    profile_id=m.profile_id,
                    placement=backend.Placement(m.start, m.size),
                )
            )
        except backend.NvmlError:
            return True

    def _notify(self, notice: Notice) -> None:
        _log.warning(notice.message, reason=notice.reason)
        if self._on_warning is not None:
            self._on_warning(notice)

    # --- reading and planning ----------------------------------------------------------------

    def _completed(self, claim: ClaimRef) -> tuple[PreparedDevice, ...] | None:
        """The answer of a completed prepare of the claim, with its CDI spec written again if it is gone; None when
        the claim is not prepared. Under the locks."""
        record = self._cp.claims.get(claim.uid)
        if record is None or record.phase is not checkpoint.Phase.COMPLETED:
            return None
        try:
            self._restore_spec(record)
        except OSError as err:
            raise PrepareError(
                f"claim {claim.namespace}/{claim.name}: its CDI spec is gone and cannot be written again: {err}"
            ) from None
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
        ours = [r for r in resource.allocation.results if r.driver == self._driver]
        for index, r in enumerate(resource.allocation.results):
            if r.driver == self._driver and r.pool != self._node:
                # A GPU is in the pool of its own node only: this claim was allocated for another node.
                raise PrepareError(
                    f"claim {name}: status.allocation.devices.results[{index}] is device {r.device} in pool {r.pool}, "
                    f"not in this node's pool {self._node}: the claim is allocated to another node"
                )
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
        return f"claim {name}: {opaque.message(err, resource.allocation.config)}"

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

    def _conflict(self, claim: ClaimRef, items: Sequence[_Item]) -> tuple[str, checkpoint.ClaimRecord] | None:
        """The first non-admin device of `items` another prepared claim holds, with that claim's record, unless both
        hold it as shares of a multi-allocatable device (a share has a shareID); None when there is none."""
        for item in items:
            if item.admin:
                continue
            for record in self._cp.claims.values():
                if record.uid == claim.uid:
                    continue
                held_whole = item.device in record.exclusive
                if held_whole or (item.share_id is None and item.device in record.shared):
                    return item.device, record
        return None

    def _holder_pods(self, holder: checkpoint.ClaimRecord) -> str:
        """` (pods ns/a, ns/b)`: the pods a prepared claim is reserved for, read now; empty when it cannot be read."""
        try:
            current = self._claims.get_claim(holder.namespace, holder.name)
        except Exception:  # noqa: BLE001 (only a message's detail: the refusal stands without it)
            return ""
        return _pods(current) if current is not None and current.meta.uid == holder.uid else ""

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

    def _started_record(self, claim: ClaimRef, items: Sequence[_Item]) -> checkpoint.ClaimRecord:
        """The PrepareStarted record of a prepare of these items: every side effect it is about to make. Pure."""
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
        return checkpoint.ClaimRecord(
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

    def _apply(self, claim: ClaimRef, items: tuple[_Item, ...]) -> tuple[PreparedDevice, ...]:
        started = self._started_record(claim, items)
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
        plan = self._visibility(claim, resolved, by_item)
        entries = self._write_cdi(claim, plan)
        completed = dataclasses.replace(
            record, phase=checkpoint.Phase.COMPLETED, devices=plan.prepared, cdi_devices=entries
        )
        self._store(completed, uid=claim.uid)
        return plan.prepared

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

    def _common_edits(self) -> cdi.ContainerEdits:
        """What every claim's spec holds beside its devices: the driver's files and the control nodes."""
        control = (
            cdi.ContainerEdits(device_nodes=tuple(cdi.device_node(p) for p in _CONTROL_NODES))
            if self._device_nodes
            else cdi.ContainerEdits()
        )
        return self._common.common_edits().merged(control)

    def _write_cdi(self, claim: ClaimRef, plan: visibility.Plan) -> tuple[dict[str, Any], ...]:
        """Write the claim's spec; returns its device entries, which the checkpoint records."""
        entries = cdi.device_entries(claim_uid=claim.uid, devices=plan.entries)
        if entries:
            cdi.write_spec(self._cdi_root, claim.uid, cdi.spec_of(entries, common=self._common_edits()))
        return entries

    def _restore_spec(self, record: checkpoint.ClaimRecord) -> bool:
        """Write a prepared claim's CDI spec again, from the checkpoint, when it is gone from the CDI directory (a
        tmpfs /var/run/cdi cleaned, a file removed by hand): containers of the claim that start or restart later
        need it. Returns whether it wrote. Idempotent; under the locks. Raises OSError when the write fails."""
        if record.phase is not checkpoint.Phase.COMPLETED:
            return False
        path = cdi.spec_path(self._cdi_root, record.uid)
        if path.exists():
            return False
        if not record.cdi_devices:
            raise OSError(
                f"{path} is gone, and the checkpoint record, written by an older agent, does not hold its devices: "
                "delete the claim's pods so that it is prepared again"
            )
        cdi.write_spec(self._cdi_root, record.uid, cdi.spec_of(record.cdi_devices, common=self._common_edits()))
        self._notify(
            Notice(
                reason="CDISpecRestored",
                message=f"the CDI spec of prepared claim {_describe(record)} was gone from {self._cdi_root}; "
                f"written again from the checkpoint as {path.name}",
            )
        )
        return True

    def _restore_specs(self, errors: list[str]) -> tuple[pathlib.Path, ...]:
        """`_restore_spec` for every prepared claim; what it wrote, and each failure appended to `errors`. Under
        the locks."""
        restored = []
        for record in self._cp.claims.values():
            try:
                if self._restore_spec(record):
                    restored.append(cdi.spec_path(self._cdi_root, record.uid))
            except OSError as err:
                errors.append(f"claim {_describe(record)}: its CDI spec is gone and cannot be written ({err})")
        return tuple(restored)

    def _visibility(self, claim: ClaimRef, items: Sequence[_Item], by_item: Mapping[int, str]) -> visibility.Plan:
        """The claim's CDI devices (name and edits) and what the kubelet gets for each device. Reads MIG
        capability minors from /proc; otherwise pure (the rebuild recomputes the answer a prepare gave)."""
        devices = []
        for position, item in enumerate(items):
            edits = self._device_edits(item)
            config = item.selected.config.sharing
            if item.share_id is not None and config is not None and config.mps is not None:
                if config.mps.default_active_thread_percentage is not None:
                    percentage = config.mps.default_active_thread_percentage
                    edits = edits.merged(cdi.ContainerEdits(env=(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percentage}",)))
            if position in by_item:
                edits = edits.merged(self._mps.workload_edits(by_item[position]))
            devices.append(
                visibility.Device(
                    request=item.base,
                    device=item.device,
                    cdi_name=item.cdi_device,
                    share_id=item.share_id,
                    uuid=item.uuid or "",
                    memory_mib=item.memory_mib,
                    edits=edits,
                )
            )
        return visibility.plan(claim_uid=claim.uid, pool=self._node, devices=devices)

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
