"""leaseworker's exception tree, in one place.

::

    LeaseworkerError
    ├── ConfigError                 invalid settings, raised at construction
    ├── MalformedTrigger            a Kafka record that cannot become a job (carries .reason)
    ├── BadResult                   a job's result no completion store can keep (carries .key)
    ├── StoreUnavailable            the completion store failed or timed out (carries .key)
    ├── TransactionRefused          a job's transaction met a higher fence (carries .status)
    ├── ChildProcessDied            a job's child process died by itself (carries .pid, .signal)
    └── LeaseError                  about one job key's lease (carries .key)
        ├── LeaseBusy               another owner holds the lease
        ├── LeaseUnavailable        Redis did not answer an acquire in time
        ├── LeaseLost               ownership became uncertain; the work was stopped
        └── LeaseTimeout            the body outlived ``max_runtime``

Lower-level errors (redis-py's, psycopg's, sqlite3's, timeouts) are translated at the adapter with
``raise ... from exc`` so callers handle one tree and still see the cause.
"""

from __future__ import annotations

import signal as _signal

from ._outcome import LeaseLostReason, MalformedReason


class LeaseworkerError(Exception):
    """Root of every error leaseworker raises on purpose."""


class ConfigError(LeaseworkerError, ValueError):
    """Raised at construction when settings cannot keep leaseworker's guarantees.

    For example a renewal interval that cannot complete before the local lease
    deadline. It is a ``ValueError`` too, so generic validation code catches it.
    """


class MalformedTrigger(LeaseworkerError, ValueError):
    """Raised while decoding a trigger that can never become a job.

    The worker sends such records to the dead-letter topic and commits them, so
    one bad record cannot block its partition. ``reason`` is a stable code for
    dashboards and the dead-letter headers (one of the
    :data:`~leaseworker.DeadLetterReason` codes): ``too_large``, ``not_json``,
    ``not_object``, ``bad_key``, ``no_job_key``, ``bad_job_key`` or
    ``job_key_error``. The message never quotes the payload: payloads may carry
    personal data.
    """

    def __init__(self, reason: MalformedReason, detail: str) -> None:
        super().__init__(f"malformed trigger ({reason}): {detail}")
        self.reason = reason
        self.detail = detail


class BadResult(LeaseworkerError, ValueError):
    """Raised by ``ctx.complete()`` (or the executor's implicit one) for a result no store keeps.

    Not JSON (a ``datetime``, a ``set``, ``bytes``, ``NaN``), a non-string
    mapping key (JSON would silently turn ``{1: "a"}`` into ``{"1": "a"}``),
    text with NUL or a lone surrogate, or more than ``max_result_bytes`` of
    JSON. The trigger ends ``failed`` and is dead-lettered with reason
    ``bad_result``. ``detail`` names the problem, never a value: results may
    quote payload data.
    """

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"result of {key!r} cannot be stored: {detail}")
        self.key = key
        self.detail = detail


class StoreUnavailable(LeaseworkerError):
    """Raised when the completion store fails or does not answer within its timeout.

    ``key`` is the job key of the call (``None`` while opening the store). The
    call's transaction was rolled back, unless the connection broke while
    committing: then the completion may have been recorded, and calling
    ``complete()`` again with the same identity answers ``duplicate`` if it was.
    The message never quotes result payloads or the database password.
    """

    def __init__(self, key: str | None, detail: str) -> None:
        where = "" if key is None else f" for {key!r}"
        super().__init__(f"completion store unavailable{where}: {detail}")
        self.key = key
        self.detail = detail


class TransactionRefused(LeaseworkerError):
    """Raised by ``ctx.transaction()`` when the job key's store refuses this execution's writes.

    ``status`` is ``stale`` (a fence above this execution's ``fence`` was
    seen: a newer execution claimed or completed the job key) or
    ``duplicate`` (the identity completed meanwhile); ``seen`` is the highest
    fence the store has seen. Nothing was written; the execution ends
    ``lost`` (``stale``) or ``duplicate`` as the store's answer says.
    """

    def __init__(self, key: str, *, status: str, fence: int, seen: int) -> None:
        super().__init__(
            f"transaction of {key!r} refused ({status}): fence {fence}, highest fence seen {seen}"
        )
        self.key = key
        self.status = status
        self.fence = fence
        self.seen = seen


class ChildProcessDied(LeaseworkerError):
    """Raised by ``run_in_process`` when the job's child process died by itself while it ran.

    A segfault, the OOM killer, ``os._exit``: not a kill by the pod (that is a
    cancellation, whose reason is the execution's). ``signal`` is the number of
    the signal that ended it (``None`` if it exited), ``exit_code`` its exit code
    (``None`` if a signal ended it). The worker is replaced; the call is not retried.
    """

    def __init__(self, pid: int, *, signal: int | None, exit_code: int | None) -> None:
        super().__init__(f"the job's child process died ({_cause(signal, exit_code)}) while it ran")
        self.pid = pid
        self.signal = signal
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[object, ...]:
        return (_child_process_died, (self.pid, self.signal, self.exit_code), self.__dict__)


def _child_process_died(pid: int, number: int | None, exit_code: int | None) -> ChildProcessDied:
    return ChildProcessDied(pid, signal=number, exit_code=exit_code)


def _cause(number: int | None, exit_code: int | None) -> str:
    if number is None:
        return f"exit code {exit_code}"
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class LeaseError(LeaseworkerError):
    """Base for errors about one job key's lease; ``key`` names the job key."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class LeaseBusy(LeaseError):
    """Raised by ``hold()`` when another owner holds the lease for ``key``.

    ``retry_after`` is the holder's remaining TTL in seconds as Redis reported
    it, a hint for when to try again (0 when the lease ended before it was
    read, ``None`` when unknown).
    """

    def __init__(self, key: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"lease for {key!r} is held by another owner", key=key)
        self.retry_after = retry_after


class LeaseUnavailable(LeaseError):
    """Raised when Redis fails or does not answer an acquire within its timeout.

    Whether the lease was taken is unknown; leaseworker tries to release it with
    the same owner token, and otherwise it expires after its TTL.
    """

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"lease store unavailable for {key!r}: {detail}", key=key)


class LeaseLost(LeaseError):
    """Raised when ownership of a held lease became uncertain and the work stopped.

    ``reason`` says why, a :data:`~leaseworker.LeaseLostReason`: ``rejected``
    (another owner, or the key is gone), ``timeout`` or ``error`` (the renewal
    got no answer), ``late`` (the answer came after the local deadline),
    ``unreplicated`` (fewer replicas than required acknowledged the renewal),
    ``deadline`` (no renewal confirmed in time), ``loop_blocked`` (the event
    loop was stalled past the deadline).
    ``stop_latency`` is how long the body took to actually stop after the loss
    (seconds; ``None`` when raised from ``renew()`` outside ``hold()``).
    """

    def __init__(
        self,
        key: str,
        *,
        fence: int,
        reason: LeaseLostReason,
        stop_latency: float | None = None,
        detail: str = "",
    ) -> None:
        text = f"lease for {key!r} (fence {fence}) lost: {reason}"
        if detail:
            text += f" ({detail})"
        if stop_latency is not None:
            text += f"; body stopped {stop_latency * 1000:.1f} ms after the loss"
        super().__init__(text, key=key)
        self.fence = fence
        self.reason = reason
        self.detail = detail
        self.stop_latency = stop_latency

    def __reduce__(self) -> tuple[object, ...]:
        # Crosses a process boundary whole (raised in a job's child process).
        fields = (self.key, self.fence, self.reason, self.stop_latency, self.detail)
        return (_lease_lost, fields, self.__dict__)


def _lease_lost(
    key: str, fence: int, reason: LeaseLostReason, stop_latency: float | None, detail: str
) -> LeaseLost:
    return LeaseLost(key, fence=fence, reason=reason, stop_latency=stop_latency, detail=detail)


class LeaseTimeout(LeaseError):
    """Raised by ``hold()`` when the body ran longer than ``max_runtime``.

    The lease was still owned; the body was cancelled because of the runtime bound.
    """

    def __init__(self, key: str, *, fence: int, max_runtime: float) -> None:
        super().__init__(
            f"job {key!r} (fence {fence}) exceeded max_runtime={max_runtime}s", key=key
        )
        self.fence = fence
        self.max_runtime = max_runtime
