"""What `stepcli capture` may ask of a running process: the limits, and the check every request
passes first.

Runs inside the target: standard library only. Only the run's owner can write requests, but a
hand-written or damaged one must cost the job nothing: a request that fails the check is refused
(with the reason, when it has an id to answer) and never stops the process from obeying the next
good one.
"""

from __future__ import annotations

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_WAIT = 100_000  # `capture --wait`: steps let go by before the warmup
MAX_WARMUP = 1_000  # `capture --warmup`
MAX_ACTIVE = 1_000  # `capture --active`: steps recorded in one trace
MAX_STEP = 2**62  # no step count gets anywhere near: a bound, so arithmetic on steps stays small
MAX_ID_CHARS = 64
MAX_ENTRIES = 16  # requests (and pings) looked at in requests.json; more are ignored
MAX_PENDING = 8  # windows a process has accepted and not yet recorded
MAX_CONTROL_BYTES = 32 * 1024  # requests.json is read up to this size; a larger one is refused
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class Invalid(ValueError):
    """A request or ping this process will not obey; the message names the field, never its (forged)
    value."""


def check_id(value: Any) -> str:
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_ID_CHARS
        or not set(value) <= _ID_CHARS
    ):
        raise Invalid(
            f"its id is not a string of 1 to {MAX_ID_CHARS} letters, digits, '-', '_' or '.'"
        )
    return value


def _step(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEP:
        raise Invalid("open_at, first_step and last_step must be whole numbers from 0 to 2**62")
    return value


def check_request(entry: Any) -> tuple[str, int, int, int]:
    """(id, open_at, first_step, last_step) of a well-formed request; Invalid otherwise."""
    if not isinstance(entry, dict):
        raise Invalid("a request is not a JSON object")
    rid = check_id(entry.get("id"))
    open_at, first, last = (_step(entry.get(key)) for key in ("open_at", "first_step", "last_step"))
    if not open_at <= first <= last:
        raise Invalid("it needs open_at <= first_step <= last_step")
    if first - open_at > MAX_WARMUP:
        raise Invalid(f"its warmup is longer than {MAX_WARMUP} steps")
    if last - first + 1 > MAX_ACTIVE:
        raise Invalid(f"it records more than {MAX_ACTIVE} steps")
    return rid, open_at, first, last


def request_id(entry: Any) -> str | None:
    """The id to answer a bad request under, when it has a usable one."""
    try:
        return check_id(entry.get("id")) if isinstance(entry, dict) else None
    except Invalid:
        return None


def check_ping(
    entry: Any, default_lease: float, shortest: float, longest: float
) -> tuple[str, float]:
    """(id, lease in seconds, clamped to [shortest, longest]) of a well-formed ping; Invalid
    otherwise."""
    if not isinstance(entry, dict):
        raise Invalid("a ping is not a JSON object")
    pid = check_id(entry.get("id"))
    lease = entry.get("lease_s", default_lease)
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or lease != lease:
        raise Invalid("its lease_s is not a number")
    return pid, min(max(float(lease), shortest), longest)


def entries(document: dict[str, Any], key: str) -> list[Any]:
    """The first MAX_ENTRIES entries of a list in the document (none when it is not a list)."""
    value = document.get(key)
    return value[:MAX_ENTRIES] if isinstance(value, list) else []
