"""Which failed requests the kube client sends again (client-go's rules), how long it waits first, and the rate limiter
and write fence every attempt goes through. No API server: answers are scripted, or nothing listens at all."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import controlplane
import pytest
from support.scripted_client import Response, scripted

from dractl.kube import client

_UNSENT = client.Transient(0, "ConnectionFailed", "connection refused", unsent=True)
_BROKEN = client.Transient(0, "ConnectionFailed", "connection reset by peer")


def _status(code: int, *, retry_after: float | None = None) -> client.ApiError:
    return client.error_from_status(code, b"", retry_after=retry_after)


# (method, error, sent again?)
DECISIONS: dict[str, tuple[str, BaseException, bool]] = {
    "get-503": ("GET", _status(503), True),
    "get-500": ("GET", _status(500), True),
    "get-broken": ("GET", _BROKEN, True),
    "get-429": ("GET", _status(429), True),
    "get-409-not-transient": ("GET", _status(409), False),
    "get-404-not-transient": ("GET", _status(404), False),
    "post-unsent": ("POST", _UNSENT, True),
    "post-429": ("POST", _status(429), True),
    "post-429-retry-after": ("POST", _status(429, retry_after=1), True),
    "post-503": ("POST", _status(503), False),
    "post-503-retry-after": ("POST", _status(503, retry_after=1), False),
    "post-504-retry-after": ("POST", _status(504, retry_after=2), False),
    "post-broken": ("POST", _BROKEN, False),
    "put-unsent": ("PUT", _UNSENT, True),
    "put-503": ("PUT", _status(503), False),
    "put-503-retry-after": ("PUT", _status(503, retry_after=1), True),
    "put-broken": ("PUT", _BROKEN, False),
    "patch-500": ("PATCH", _status(500), False),
    "patch-500-retry-after": ("PATCH", _status(500, retry_after=0), True),
    "patch-429": ("PATCH", _status(429), True),
    "patch-broken": ("PATCH", _BROKEN, False),
    "delete-503": ("DELETE", _status(503), False),
    "delete-503-retry-after": ("DELETE", _status(503, retry_after=1), True),
    "delete-unsent": ("DELETE", _UNSENT, True),
    "patch-409-not-transient": ("PATCH", _status(409, retry_after=1), False),
    "fenced-write": ("PATCH", client.Fenced(0, "Fenced", "lease lost"), False),
    "not-an-api-error": ("GET", ValueError("a bug"), False),
}


@pytest.mark.parametrize(("method", "error", "again"), list(DECISIONS.values()), ids=list(DECISIONS))
def test_may_retry_follows_client_go(method: str, error: BaseException, again: bool) -> None:
    """Guards: reads are sent again after any transient failure; a write only when it never reached the server, the
    server turned it away (429) or asked for a retry (5xx with Retry-After, never for a POST: a create may have
    landed); nothing that is not transient, and never a fenced write."""
    assert client.may_retry(method, error) is again


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("3", 3.0), (" 0 ", 0.0), ("1.5", 1.5), (None, None), ("-1", None), ("Wed, 21 Oct 2015 07:28:00 GMT", None)],
    ids=["seconds", "zero", "fraction", "absent", "negative", "http-date"],
)
def test_retry_after_header_parsing(header: str | None, seconds: float | None) -> None:
    """Guards: a Retry-After of whole or fractional seconds is read; anything else counts as absent."""
    assert client.retry_after_seconds(header) == seconds


def _scripted(
    answers: list[Response | client.ApiError], monkeypatch: pytest.MonkeyPatch, *, attempts: int = 5
) -> tuple[client.Client, list[str], list[float]]:
    """A client whose attempts take `answers` in order; the methods sent and the waits between attempts."""
    waits: list[float] = []
    made, sent = scripted(answers, monkeypatch, attempts=attempts, sleep=waits.append)
    return made, sent, waits


_CLAIM = {"metadata": {"generateName": "pod-gpu-", "namespace": "ns"}}


def test_a_create_whose_answer_broke_off_is_sent_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: a POST (generateName) that hit a reset or a 5xx is not sent again, even when the server asked for a
    retry: the first may have created the claim, and a second would make another."""
    for error in (_BROKEN, _status(500), _status(503, retry_after=1)):
        api, sent, waits = _scripted([error, Response({})], monkeypatch)
        with pytest.raises(client.Transient):
            api.create(client.RESOURCE_CLAIMS, _CLAIM)
        assert (sent, waits) == (["POST"], [])


def test_a_429_is_retried_after_the_retry_after_it_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: a create turned away with 429 is sent again once the server's Retry-After has passed, and the
    answer of the retry is returned."""
    api, sent, waits = _scripted(
        [_status(429, retry_after=3), Response({"metadata": {"name": "pod-gpu-x"}})], monkeypatch
    )
    assert api.create(client.RESOURCE_CLAIMS, _CLAIM)["metadata"]["name"] == "pod-gpu-x"
    assert sent == ["POST", "POST"]
    assert len(waits) == 1 and waits[0] >= 3.0


def test_a_retry_after_is_honoured_up_to_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: a Retry-After longer than MAX_RETRY_AFTER waits that bound, not for hours."""
    api, _, waits = _scripted([_status(503, retry_after=3600), Response({})], monkeypatch)
    api.get(client.PODS, "p", namespace="ns")
    assert waits == [client.MAX_RETRY_AFTER]


def test_reads_are_retried_with_backoff_until_the_attempts_run_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: a read is tried `attempts` times in all, with a short growing wait between tries, then raises."""
    api, sent, waits = _scripted([_BROKEN, _status(503), _BROKEN], monkeypatch, attempts=3)
    with pytest.raises(client.Transient):
        api.get(client.PODS, "p", namespace="ns")
    assert sent == ["GET"] * 3
    assert len(waits) == 2 and all(0 < wait <= 2.05 for wait in waits)


class _Limiter:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def wait(self) -> None:
        self.log.append("token")


class _Fence:
    """Lets writes through while `open` and `checks_left` last (None: no limit); records each check."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.open = True
        self.checks_left: int | None = None

    def check(self, what: str) -> None:
        self.log.append(f"fence {what.split()[0]}")
        if self.checks_left is not None:
            self.checks_left -= 1
            self.open = self.open and self.checks_left >= 0
        if not self.open:
            raise client.Fenced(0, "Fenced", f"{what}: not sent: the lease is lost")


@pytest.fixture
def unreachable(tmp_path: pathlib.Path) -> Callable[..., tuple[client.Client, list[str], list[float]]]:
    """Builds a client to a closed port, with a recording limiter and fence; closes it at the end."""
    made: list[client.Client] = []

    def build(*, attempts: int = 3) -> tuple[client.Client, list[str], list[float]]:
        log: list[str] = []
        waits: list[float] = []
        base = client.connect(controlplane.unreachable_kubeconfig(tmp_path / "kubeconfig"), attempts=attempts)
        api = client.Client(
            base.api_client, attempts=attempts, limiter=_Limiter(log), fence=_Fence(log), sleep=waits.append
        )
        made.append(base)
        return api, log, waits

    yield build
    for base in made:
        base.close()


def test_a_refused_write_is_sent_again_and_each_attempt_waits_for_a_token_and_the_fence(
    unreachable: Callable[..., tuple[client.Client, list[str], list[float]]],
) -> None:
    """Guards: a write whose connection was refused never reached the server, so it is tried `attempts` times
    (raising Transient with `unsent` at the end); every attempt takes a rate limiter token first and then asks the
    fence. urllib3's own retries are off: they would turn the refusal into a MaxRetryError, which is not `unsent`."""
    api, log, waits = unreachable(attempts=3)
    with pytest.raises(client.Transient) as raised:
        api.create(client.RESOURCE_CLAIMS, _CLAIM)
    assert raised.value.unsent and raised.value.status == 0
    # The fence is asked before the attempt and again as its first bytes go to the socket (the connection is made
    # there, and refused).
    assert log == ["token", "fence POST", "fence POST"] * 3
    assert len(waits) == 2


def test_reads_are_not_fenced_and_a_closed_fence_stops_a_write_before_it_is_sent(
    unreachable: Callable[..., tuple[client.Client, list[str], list[float]]],
) -> None:
    """Guards: a GET never asks the fence; a write the fence refuses raises Fenced at once (no connection attempt,
    which would be Transient here; no retry)."""
    api, log, waits = unreachable(attempts=3)
    with pytest.raises(client.Transient):
        api.get(client.PODS, "p", namespace="ns")
    assert log == ["token"] * 3
    log.clear()
    waits.clear()
    fence = api.fence
    assert isinstance(fence, _Fence)
    fence.open = False
    with pytest.raises(client.Fenced, match="not sent: the lease is lost"):
        api.patch(client.PODS, "p", {"metadata": {"labels": {"a": "b"}}}, namespace="ns")
    assert (log, waits) == (["token", "fence PATCH"], [])


def test_a_fence_that_closes_after_the_first_check_still_stops_the_write_at_the_socket(
    unreachable: Callable[..., tuple[client.Client, list[str], list[float]]],
) -> None:
    """Guards: the fence is asked again just before the request's bytes go out, so a write whose first check passed
    (the process was then paused past its deadline) is refused there: Fenced, never sent (no connection attempt,
    which would be Transient here), not retried."""
    api, log, waits = unreachable(attempts=3)
    fence = api.fence
    assert isinstance(fence, _Fence)
    fence.checks_left = 1
    with pytest.raises(client.Fenced):
        api.patch(client.PODS, "p", {"metadata": {"labels": {"a": "b"}}}, namespace="ns")
    assert (log, waits) == (["token", "fence PATCH", "fence PATCH"], [])
