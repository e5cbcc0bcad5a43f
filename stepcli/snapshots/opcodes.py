"""The pickle opcodes and byte readers shared by the streaming decoder's opcode loop
(stepcli.snapshots.unpickle) and its fast path (stepcli.snapshots.fastentries)."""

from __future__ import annotations

import struct

_unpack_I = struct.Struct("<I").unpack_from
_unpack_H = struct.Struct("<H").unpack_from
_unpack_i = struct.Struct("<i").unpack_from
_unpack_Q = struct.Struct("<Q").unpack_from
_unpack_d = struct.Struct(">d").unpack_from
_from_bytes = int.from_bytes

MARK = 0x28
STOP = 0x2E
EMPTY_DICT = 0x7D
EMPTY_LIST = 0x5D
MEMOIZE = 0x94
BINPUT = 0x71
LONG_BINPUT = 0x72
BINGET = 0x68
LONG_BINGET = 0x6A
SETITEMS = 0x75
APPENDS = 0x65
APPEND = 0x61
SHORT_BINUNICODE = 0x8C
BININT1 = 0x4B
BININT2 = 0x4D
BININT = 0x4A
LONG1 = 0x8A
NONE = 0x4E
NEWTRUE = 0x88
NEWFALSE = 0x89
FRAME = 0x95
