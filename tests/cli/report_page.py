"""Reads the data a report page embeds (docs/report.md, "The embedded data"), its packed
numbers unpacked into plain lists: a reader written from the documentation, independent of
the C++ writer (src/sinks/html/packed_ints.h) and of the page's own (report.js)."""
import json
import re

DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
VALUE = {c: i for i, c in enumerate(DIGITS)}


def unpack_ints(text):
    out, value, shift = [], 0, 0
    for c in text:
        d = VALUE[c]
        value |= (d & 31) << shift
        if d >= 32:
            shift += 5
        else:
            out.append(value)
            value, shift = 0, 0
    assert shift == 0, "a number cut short"
    return out


def unzigzag(u):
    return -(u + 1) // 2 if u & 1 else u // 2


def unpack_segments(text, prev, rows):
    u, out, i = unpack_ints(text), [], 0
    while i < len(u):
        tag = u[i]
        i += 1
        if tag & 1:
            out.append(prev[tag // 2])
            continue
        addr, size, stream, pool, expandable = rows[tag // 2]
        n = u[i]
        i += 1
        blocks, end = [], 0
        for _ in range(n):
            gap, sc, sa, req = u[i:i + 4]
            i += 4
            offset = end + unzigzag(gap)
            bsize = sc // 2 * 512 if sc % 2 == 0 else sc // 2
            state = sa % 4
            base = bsize if state in (1, 2) else 0
            blocks += [offset, bsize, base - unzigzag(req), state, sa // 4 - 1]
            end = offset + bsize
        out.append([addr, size, stream, pool, bool(expandable), blocks])
    return out


def unpack_allocations(p):
    def running(text):
        if text is None:
            return None
        out, last = [], 0
        for u in unpack_ints(text):
            last += unzigzag(u)
            out.append(last)
        return out

    def after(text, base):
        if text is None:
            return None
        return [-1 if u == 0 else (base[i] if base else -1) + unzigzag(u - 1)
                for i, u in enumerate(unpack_ints(text))]

    a = {k: running(p[k]) for k in ("alloc_event", "alloc_step", "alloc_time")}
    for k in ("event", "step", "time"):
        a["free_" + k] = after(p["free_" + k], a["alloc_" + k])
    a["stream"] = unpack_ints(p["stream"])
    a["site"] = [unzigzag(u) for u in unpack_ints(p["site"])]
    a["stack"] = [unzigzag(u) for u in unpack_ints(p["stack"])]
    assert all(v is None or len(v) == p["count"] for v in a.values()), "columns disagree"
    return a


def unpack(data):
    """`data` with stacks, allocations and every frame's segments as plain lists (in place)."""
    u, stacks, i = unpack_ints(data["stacks"]), [], 0
    while i < len(u):
        stacks.append(u[i + 1:i + 1 + u[i]])
        i += 1 + u[i]
    data["stacks"] = stacks
    for d in data["devices"]:
        r = unpack_ints(d.get("segments", ""))
        rows = [r[k:k + 5] for k in range(0, len(r), 5)]
        if "allocs" in d:
            d["allocs"] = unpack_allocations(d["allocs"])
        prev = []
        for f in d["frames"]:
            f["segs"] = prev = unpack_segments(f["segs"], prev, rows)
    return data


def page_data(path):
    """(the page's text, its embedded data unpacked)."""
    html = open(path, encoding="utf-8").read()
    m = re.search(r'<script type="application/json" id="fragscope-data">(.*?)</script>', html,
                  re.S)
    assert m, "no embedded data"
    return html, unpack(json.loads(m.group(1)))
