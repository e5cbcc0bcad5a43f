"""What a snapshot is made of, checked as the streaming decoder builds it: the first object that is
not of a snapshot's shape is refused (`NotSnapshot`) before the rest is built.

`torch.cuda.memory._snapshot()` is a dict: `segments` (a list of segment dicts, each with a list of
block dicts), `device_traces` (a list, one per device, of lists of event dicts),
`allocator_settings`, `external_annotations` (a list of dicts), and stepcli's record; every block
and event has a `frames` list of frame dicts ({filename, line, name}). So: a list holds items of one
kind (dicts of one of those shapes, or scalars, or, for `device_traces`, lists), a dict's keys are
strings, tuples and sets hold scalars, strings are short, and Python's pickler never puts more than
1,000 items (2,000 for a dict) on its stack at once nor nests a snapshot more than a few levels. A
pickle made to take memory (millions of empty lists in a few MB, a tower of nested tuples, a string
of gigabytes, a dict of the wrong keys) breaks one of these rules within its first few thousand
objects. The rest of the memory a decoding may take is the absolute budget
(stepcli.snapshots.snapshotreader).
"""

from __future__ import annotations

from typing import Any

from stepcli.snapshots.history import HistoryFrame, NotSnapshot, StackRef, StepRef

# objects on the pickle's stack at once (Python's pickler: 1,000 list items, 2,000 for a dict)
MAX_STACK = 4096
MAX_DEPTH = 64  # nested marks (a snapshot nests about 8 deep)
MAX_TEXT = 1 << 20  # bytes of one string (file and function names, settings: far shorter)
MAX_KEYS = 4096  # keys of one dict (torch's have 4 to 16)
MAX_SCALARS = 1 << 16  # items of a list of strings or numbers (argv)
MAX_FRAMES = 1 << 16  # frames of one stack (Python's own recursion limit is 1,000)
MAX_NESTED_LISTS = 4096  # lists held in lists, in all (device_traces: one per device)
# dicts, lists and sets held in dicts, in all, but `frames` and `blocks` (settings, records)
MAX_HELD = 1 << 16

SCALARS = (str, int, float, bool, bytes, type(None))
_SEGMENT = frozenset({"total_size", "blocks"})
_BLOCK = frozenset({"size", "state"})
_FRAME = frozenset({"filename", "line", "name"})
_ANNOTATION = frozenset({"stage", "name"})


def dict_kind(item: dict[Any, Any]) -> str:
    """Which of a snapshot's dicts this is: frame, event, block, segment or annotation; else
    NotSnapshot."""
    keys = item.keys()
    if _FRAME <= keys:
        return "frame"
    if "action" in keys:
        return "event"
    if _SEGMENT <= keys:
        return "segment"
    if _BLOCK <= keys:
        return "block"
    if _ANNOTATION <= keys:
        return "annotation"
    named = ", ".join(sorted(repr(k)[:40] for k in list(keys)[:8]))
    raise NotSnapshot(
        f"a list item is a dict of keys {{{named}}}: no frame, event, block or segment of a "
        f"snapshot"
    )


def kind(item: Any) -> str:
    """The kind of a list's item: items of one list are all of one kind."""
    if type(item) is HistoryFrame:
        return "frame"
    if type(item) is dict:
        return dict_kind(item)
    if type(item) is list:
        return "list"
    if isinstance(item, SCALARS):
        return "scalar"
    if type(item) is StackRef:
        raise NotSnapshot("a list item is a frames list: not of a snapshot's shape")
    if type(item) is StepRef:
        return "scalar"
    raise NotSnapshot(f"a list item is a {type(item).__name__}: not of a snapshot's shape")


def check_scalars(items: Any, what: str) -> None:
    """A tuple's or a set's items: strings and numbers only (a tuple of tuples nests without end, 64
    bytes each)."""
    for item in items:
        if not isinstance(item, SCALARS) and not (
            type(item) is list and all(isinstance(i, SCALARS) for i in item)
        ):
            raise NotSnapshot(f"a {what} holds a {type(item).__name__}: not of a snapshot's shape")


def check_keys(items: list[Any], target: dict[Any, Any]) -> None:
    """A dict's keys (every other item) are strings, and not too many."""
    for key in items[::2]:
        if type(key) is not str:
            raise NotSnapshot(
                f"a dict key is a {type(key).__name__}: a snapshot's keys are strings"
            )
    if len(target) + len(items) // 2 > MAX_KEYS:
        raise NotSnapshot(f"a dict of more than {MAX_KEYS} keys: not of a snapshot's shape")


def held(items: list[Any]) -> int:
    """How many of a dict's values (every other item) are dicts, lists or sets, but a `frames` or
    `blocks` list (those hold frames and blocks, checked as they are filled): a snapshot has a few
    (its settings, its record); an empty one costs 3 bytes of pickle and 100 of memory, so they
    count against MAX_HELD."""
    count = 0
    for at in range(1, len(items), 2):
        if type(items[at]) in (dict, list, set) and items[at - 1] not in ("frames", "blocks"):
            count += 1
    return count


def too_many(limit: int, what: str) -> NotSnapshot:
    return NotSnapshot(f"more than {limit} {what}")
