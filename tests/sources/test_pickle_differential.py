"""Differential test of the safe pickle reader against Python's pickle (the reference).

Random plain values (None, bools, ints of every width, floats, str with escapes and non-ASCII,
bytes, lists, tuples, dicts with non-string keys) are pickled with every protocol 0-5; the C++
reader's Document, printed by tests/sources/pickle_dump_main.cc, must equal the canonical form
of what pickle.loads returns. Run by ctest (pickle_differential) with PICKLE_DUMP set.
"""

import os
import pickle
import pickletools
import random
import subprocess

DUMP = os.environ.get("PICKLE_DUMP", "")


def rand_value(rng, depth=0):
    if depth > 3 or rng.random() < 0.5:
        kind = rng.randrange(9)
        if kind == 0:
            return None
        if kind == 1:
            return rng.random() < 0.5
        if kind == 2:
            return rng.randint(-300, 70000)
        if kind == 3:
            return rng.randint(-2**70, 2**70) * 2**rng.randrange(0, 100)
        if kind == 4:
            return rng.choice([0.0, -0.0, 1.5, 1e300, -2.5e-300, float("inf"), rng.random()])
        if kind == 5:
            return "".join(rng.choice("ab\\\n\r\x00\xe9\u20ac\U0001F600'\"u")
                           for _ in range(rng.randrange(0, 8)))
        if kind == 6:
            return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 6)))
        if kind == 7:
            return rng.randint(-2**63, 2**64)
        return rng.choice([2**63 - 1, -2**63, 2**64 - 1, 2**59, -2**59, 2**59 - 1,
                           -2**59 - 1, 2**31, -2**31 - 1, 2**8, 2**16])
    n = rng.randrange(0, 6)
    kind = rng.randrange(3)
    if kind == 0:
        return [rand_value(rng, depth + 1) for _ in range(n)]
    if kind == 1:
        return tuple(rand_value(rng, depth + 1) for _ in range(n))
    keys = ["a", "b", 1, 2**70, (1, 2), None, 1.5]
    return {rng.choice(keys): rand_value(rng, depth + 1) for _ in range(n)}


def canon(v):
    if v is None:
        return "N"
    if v is True:
        return "T"
    if v is False:
        return "F"
    if isinstance(v, int):
        if -2**63 <= v < 2**63:
            return "i%d" % v
        raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
        while len(raw) > 1 and ((raw[-1] == 0 and raw[-2] < 0x80) or
                                (raw[-1] == 0xff and raw[-2] >= 0x80)):
            raw = raw[:-1]
        return "L" + raw.hex()
    if isinstance(v, float):
        return "f%.17g" % v
    if isinstance(v, str):
        return "s" + v.encode("utf-8", "surrogatepass").hex()
    if isinstance(v, bytes):
        return "b" + v.hex()
    if isinstance(v, list):
        return "[" + "".join(canon(x) + "," for x in v) + "]"
    if isinstance(v, tuple):
        return "(" + "".join(canon(x) + "," for x in v) + ")"
    return "{" + "".join(canon(k) + ":" + canon(x) + "," for k, x in v.items()) + "}"


def test_random_values_every_protocol(tmp_path):
    assert DUMP, "set PICKLE_DUMP to the pickle_dump binary"
    rng = random.Random(2026)
    files, expected = [], []
    for i in range(1200):
        value = rand_value(rng)
        data = pickle.dumps(value, protocol=i % 6)
        ops = {op.name for op, _, _ in pickletools.genops(data)}
        if ops & {"GLOBAL", "STACK_GLOBAL", "REDUCE"}:
            continue  # bytes below protocol 3 are pickled as a call to _codecs.encode
        path = tmp_path / ("%d.pickle" % i)
        path.write_bytes(data)
        files.append(str(path))
        expected.append(canon(pickle.loads(data)))
    assert len(files) > 900
    out = subprocess.run([DUMP] + files, capture_output=True, text=True, check=True,
                         timeout=120).stdout.splitlines()
    assert len(out) == len(files)
    for path, want, got in zip(files, expected, out):
        assert got == want, path
