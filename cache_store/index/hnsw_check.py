"""Structural check of an hnswlib graph file before hnswlib loads it (hnswlib trusts neighbour ids blindly).

hnswlib's ``saveIndex`` writes: a fixed header (offsetLevel0, max_elements, cur_element_count,
size_data_per_element, label_offset, offsetData as u64; maxlevel as i32; enterpoint as u32; maxM, maxM0, M as
u64; mult as f64; ef_construction as u64), then ``cur_element_count`` level-0 records (u32 neighbour count in
the low 16 bits plus a deleted flag, maxM0 u32 neighbour ids, dim f32, u64 label), then per element a u32 byte
length and its upper-level link lists (per level: u32 count, maxM u32 ids). Every count, id, level and size is
checked here, so a crafted file is refused instead of crashing the process at the first search.
"""
from __future__ import annotations

import struct

import numpy as np

_HEAD = struct.Struct("<6Q i I 3Q d Q")
_MAX_LEVEL = 64  # mult = 1/ln(M) makes level 64 astronomically unlikely; anything above is crafted


class HnswFormatError(ValueError):
    """The bytes are not a graph hnswlib wrote for this dimension, or they hold out-of-range references."""


def check_hnsw_graph(data: bytes, dim: int) -> tuple[int, int, np.ndarray]:
    """Validate a saved hnswlib graph; return (element count, max elements, labels in slot order)."""
    if len(data) < _HEAD.size:
        raise HnswFormatError("graph shorter than its header")
    (off0, max_el, count, per_el, label_off, data_off, max_level, enter, max_m, max_m0, m, mult,
     ef_c) = _HEAD.unpack_from(data, 0)
    if not (0 <= count <= max_el <= 1 << 31):
        raise HnswFormatError(f"element counts {count} / {max_el} are implausible")
    if not (2 <= m <= 4096 and max_m == m and max_m0 == 2 * m and 1 <= ef_c <= 1 << 20 and np.isfinite(mult)):
        raise HnswFormatError("graph parameters (M, maxM, maxM0, ef_construction, mult) are inconsistent")
    links0 = 4 + 4 * max_m0
    if off0 != 0 or data_off != links0 or label_off != links0 + 4 * dim or per_el != label_off + 8:
        raise HnswFormatError("record layout does not match the dimension and M")
    if not (0 <= max_level <= _MAX_LEVEL) and not (count == 0 and max_level == -1):
        raise HnswFormatError(f"max level {max_level} is out of range")
    if count and enter >= count:
        raise HnswFormatError(f"entry point {enter} is not an element")
    body = _HEAD.size + count * per_el
    if len(data) < body:
        raise HnswFormatError("graph truncated inside the level-0 records")
    rec = np.frombuffer(data, dtype=np.uint8, count=count * per_el, offset=_HEAD.size).reshape(count, per_el)
    head0 = rec[:, :4].copy().view("<u4").ravel()
    n0 = head0 & 0xFFFF
    if (n0 > max_m0).any():
        raise HnswFormatError("a level-0 neighbour list is longer than maxM0")
    ids0 = rec[:, 4:links0].copy().view("<u4")
    used = np.arange(max_m0)[None, :] < n0[:, None]
    if (ids0[used] >= count).any():
        raise HnswFormatError("a level-0 neighbour id points past the last element")
    vectors = rec[:, data_off:label_off].copy().view("<f4")
    if not np.isfinite(vectors).all():
        raise HnswFormatError("stored vectors are not finite")
    labels = rec[:, label_off:].copy().view("<u8").ravel()
    if count and (labels > np.iinfo(np.int64).max).any():
        raise HnswFormatError("labels do not fit int64")
    per_level = 4 + 4 * max_m
    pos, top = body, -1 if count == 0 else 0
    for slot in range(count):
        if pos + 4 > len(data):
            raise HnswFormatError("graph truncated inside the upper-level links")
        (size,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if size % per_level or size // per_level > max_level or pos + size > len(data):
            raise HnswFormatError(f"element {slot} has a malformed upper-level link list")
        levels = size // per_level
        if levels:
            block = np.frombuffer(data, dtype="<u4", count=size // 4, offset=pos).reshape(levels, 1 + max_m)
            n = block[:, 0] & 0xFFFF
            if (n > max_m).any():
                raise HnswFormatError(f"element {slot} has a neighbour list longer than maxM")
            mask = np.arange(max_m)[None, :] < n[:, None]
            if (block[:, 1:][mask] >= count).any():
                raise HnswFormatError(f"element {slot} links to an element that does not exist")
            top = max(top, levels)
        pos += size
    if pos != len(data):
        raise HnswFormatError("trailing bytes after the graph")
    if count and top != max_level:
        raise HnswFormatError(f"max level {max_level} disagrees with the elements' levels (top {top})")
    return count, max_el, labels.astype(np.int64)
