"""Schedule files on their way to the kernel: a verified Schedule travels through the torch op
(whose signature carries strings) under a key, "table:<digest>". Pure Python."""
from __future__ import annotations

from ..caches import digest
from ..schedule.ir import Schedule

TABLE_PREFIX = "table:"
_TABLES: dict[str, Schedule] = {}
# Keys by the identity of the Schedule objects already registered (kept alive in _TABLES, so an
# id is never reused): a training loop passes the same object every call, and its digest
# reads every task.
_KEYS: dict[int, str] = {}


def register(schedule: Schedule) -> str:
    """The key a verified schedule file travels under (the same schedule, the same key)."""
    key = _KEYS.get(id(schedule))
    if key is None:
        key = TABLE_PREFIX + digest({"schedule": schedule.to_json()})[:24]
        if _TABLES.setdefault(key, schedule) is schedule:
            _KEYS[id(schedule)] = key
    return key


def is_table(schedule: str) -> bool:
    return schedule.startswith(TABLE_PREFIX)


def table_of(key: str) -> Schedule:
    try:
        return _TABLES[key]
    except KeyError:
        raise ValueError(f"schedule={key!r} names no schedule this process loaded "
                         f"(dashgen.load_schedule)") from None
