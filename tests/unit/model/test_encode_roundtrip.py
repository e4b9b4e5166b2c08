"""Property: any valid claim survives encode -> decode unchanged (the encoder writes what the decoder reads)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dractl import model
from dractl.model import decode, encode

NAMES = st.from_regex(r"[a-z]([a-z0-9-]{0,6}[a-z0-9])?", fullmatch=True)
QUANTITIES = st.sampled_from(["1", "10Gi", "500m", "80G", "4864Mi"]).map(model.quantity.parse)
TOLERATIONS = st.one_of(
    st.builds(
        model.DeviceToleration,
        key=st.just("example.com/k"),
        operator=st.just("Exists"),
        effect=st.sampled_from(["", "NoSchedule", "NoExecute"]),
    ),
    st.builds(
        model.DeviceToleration,
        key=st.just("example.com/k"),
        operator=st.just("Equal"),
        value=st.sampled_from(["", "v"]),
        toleration_seconds=st.none() | st.integers(0, 600),
    ),
)
SELECTORS = st.lists(st.sampled_from(['device.driver == "gpu.nvidia.com"', "true"]), max_size=2).map(tuple)
MODES = st.one_of(
    st.just((model.AllocationMode.ALL, 0)),
    st.tuples(st.just(model.AllocationMode.EXACT_COUNT), st.integers(1, 4)),
)


@st.composite
def exact_requests(draw: st.DrawFn) -> model.ExactDeviceRequest:
    mode, count = draw(MODES)
    return model.ExactDeviceRequest(
        device_class_name=draw(st.sampled_from(["gpu.nvidia.com", "mig.nvidia.com"])),
        selectors=draw(SELECTORS),
        allocation_mode=mode,
        count=count,
        admin_access=draw(st.sampled_from([None, True, False])),
        tolerations=tuple(draw(st.lists(TOLERATIONS, max_size=2))),
        capacity_requests=draw(
            st.dictionaries(st.sampled_from(["memory", "gpu.nvidia.com/cores"]), QUANTITIES, max_size=2)
        ),
    )


@st.composite
def subrequests(draw: st.DrawFn, name: str) -> model.DeviceSubRequest:
    mode, count = draw(MODES)
    return model.DeviceSubRequest(
        name=name, device_class_name="gpu.nvidia.com", selectors=draw(SELECTORS), allocation_mode=mode, count=count
    )


@st.composite
def claims(draw: st.DrawFn) -> model.ResourceClaim:
    requests = []
    for name in draw(st.lists(NAMES, min_size=1, max_size=3, unique=True)):
        if draw(st.booleans()):
            requests.append(model.DeviceRequest(name, exactly=draw(exact_requests())))
        else:
            subs = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
            requests.append(model.DeviceRequest(name, first_available=tuple(draw(subrequests(s)) for s in subs)))
    refs = [r.name for r in requests] + [f"{r.name}/{s.name}" for r in requests for s in r.first_available]
    chosen = st.lists(st.sampled_from(refs), max_size=2, unique=True).map(tuple)
    constraints = tuple(
        draw(
            st.lists(
                st.builds(
                    model.DeviceConstraint, requests=chosen, match_attribute=st.just("gpu.nvidia.com/parentUUID")
                ),
                max_size=2,
            )
        )
    )
    opaque = model.OpaqueDeviceConfiguration("gpu.nvidia.com", {"sharing": {"strategy": "MPS"}})
    config = tuple(
        draw(st.lists(st.builds(model.DeviceClaimConfiguration, requests=chosen, opaque=st.just(opaque)), max_size=2))
    )
    allocation = None
    if draw(st.booleans()):
        results = tuple(
            model.DeviceRequestAllocationResult(
                request=ref,
                driver="gpu.nvidia.com",
                pool="node-1",
                device=f"gpu-{i}",
                admin_access=draw(st.sampled_from([None, True])),
                consumed_capacity=draw(st.dictionaries(st.just("memory"), QUANTITIES, max_size=1)),
            )
            for i, ref in enumerate(draw(st.lists(st.sampled_from(refs), min_size=1, max_size=3)))
        )
        selector = model.NodeSelector(
            (model.NodeSelectorTerm(match_fields=(model.NodeSelectorRequirement("metadata.name", "In", ("node-1",)),)),)
        )
        allocation = model.AllocationResult(
            results=results,
            config=(model.DeviceAllocationConfiguration("FromClass", (), opaque),),
            node_selector=draw(st.sampled_from([None, selector])),
        )
    reserved = (
        (model.ResourceClaimConsumerReference("pods", "p", "u-1"),)
        if allocation is not None and draw(st.booleans())
        else ()
    )
    meta = model.ObjectMeta(
        name=draw(NAMES), namespace=draw(NAMES), labels=draw(st.dictionaries(NAMES, NAMES, max_size=2))
    )
    spec = model.ResourceClaimSpec(requests=tuple(requests), constraints=constraints, config=config)
    return model.ResourceClaim(meta=meta, spec=spec, allocation=allocation, reserved_for=reserved)


@settings(max_examples=60, database=None, derandomize=True, deadline=None)
@given(claims())
def test_encode_then_decode_is_identity(claim: model.ResourceClaim) -> None:
    """Guards: every field the encoder writes is read back to the same value, defaults and omissions included."""
    again = decode.load_documents([encode.resource_claim(claim)]).resource_claims[0]
    assert (again.meta, again.spec, again.allocation, again.reserved_for) == (
        claim.meta,
        claim.spec,
        claim.allocation,
        claim.reserved_for,
    )
