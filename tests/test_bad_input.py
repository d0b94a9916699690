"""Corrupt and truncated shards: shardfs must refuse them cleanly.

A small valid shard is built once; every variant below is a copy with some
bytes changed or cut (offsets from the format, docs/format.md "Layout": the
header is seven big-endian u64 at byte 32 + 8*i; slots are 40 bytes at
index_position; the hash section is cmph's CHD_PH dump).

For each variant:

- the Python API, probed in a subprocess (a crash in the C core must show as
  a failed test, not kill pytest), never dies of a signal and raises only
  ``CorruptShardError`` (or ``KeyError`` for a key it cannot find);
- every CLI command (info, ls, get, check, check --hash) ends within 30 s,
  never by a signal, with exit status 0 or 1, and when 1 with exactly one
  stderr line ``shardfs: ...`` and no traceback.

Expectations by level:

- OPEN: the damage is visible in the header, the hash section or the file
  length, so ``Shard(path)`` raises CorruptShardError naming the file, and
  every CLI command exits 1.
- SLOT: one index slot or one object's size field is wrong. Opening may
  succeed (slots are checked lazily), but the damaged object's lookup raises
  CorruptShardError or reports not-found, ``check`` reports it, the other
  objects still read correctly, and every CLI command (info and ls read
  every slot; get asks for the damaged key) exits 1.
- CHECK: the header is self-consistent but contradicts the rest of the
  file. Opening may succeed; ``check`` must report a problem and exit 1;
  info, ls and get may succeed.
- HASH: the structure is sound but a key does not match its content (a slot
  whose key was overwritten by one that hashes to the same slot): only
  ``check --hash`` must see it.
"""

import hashlib
import json
import os
import random
import struct
import subprocess
import sys

import pytest

import shardfs

SHARDFS = [sys.executable, "-m", "shardfs"]
TIMEOUT = 30  # seconds, per subprocess

HEADER_FIELDS = (
    "version", "objects_count", "objects_position", "objects_size",
    "index_position", "index_size", "hash_position",
)
U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1

OPEN, SLOT, CHECK, HASH = "open", "slot", "check", "hash"

# Objects of the test shard: sizes in bytes, including an empty object.
SIZES = [0, 1, 37, 100, 1000, 5000]


# ----------------------------------------------------------- the valid shard


class Valid:
    """The valid shard's bytes and the positions of its parts.

    Attributes: data (bytes), header (dict of the 7 fields), extent (bytes),
    objects ({key32: content}), slots (index_size / 40), victim (a key of a
    1000-byte object), victim_slot, victim_size_field (absolute offset of
    its u64 size field), hash layout offsets (absolute): hash_keys_field,
    hash_state_len, hash_state, cs_len, cs, hash_n, hash_nbuckets.
    """


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    rng = random.Random(1234)
    objects = {}
    for size in SIZES:
        data = rng.randbytes(size)
        objects[hashlib.sha256(data).digest()] = data
    path = tmp_path_factory.mktemp("valid") / "valid.shard"
    with shardfs.ShardWriter(str(path)) as w:
        for key, data in objects.items():
            w.add(key, data)
    v = Valid()
    v.objects = objects
    v.victim = next(k for k, d in objects.items() if len(d) == 1000)
    with shardfs.Shard(str(path)) as s:
        v.header = dict(zip(HEADER_FIELDS, s.header))
        v.extent = s.extent
        v.slots = s.slot_count
        v.victim_slot = s.slot_of(v.victim)
        data_offset, size = s.locate(v.victim)
        v.victim_size_field = data_offset - 8
        # keys to write over the victim's key in its slot: one that the
        # perfect hash sends elsewhere, one that it sends to the same slot
        candidates = (hashlib.sha256(b"garbled %d" % i).digest() for i in range(100_000))
        v.garbled_elsewhere = next(k for k in candidates if s.slot_of(k) != v.victim_slot)
        v.garbled_same_slot = next(k for k in candidates if s.slot_of(k) == v.victim_slot)
        assert s.check(hash=True) == []
    v.data = path.read_bytes()
    h = v.header
    assert v.data[:8] == b"SWHShard"
    assert struct.unpack(">7Q", v.data[32:88]) == tuple(h[f] for f in HEADER_FIELDS)
    slot = h["index_position"] + 40 * v.victim_slot
    assert v.data[slot:slot + 32] == v.victim
    assert struct.unpack(">Q", v.data[slot + 32:slot + 40])[0] == v.victim_size_field
    # The CHD_PH dump (cmph 2.0.2): "chd_ph\0", u32 size (range), u32 length
    # + hash state ("jenkins\0" + u32 seed), u32 length + compressed sequence,
    # u32 n (bins = slots), u32 nbuckets; all little-endian.
    p = h["hash_position"]
    assert v.data[p:p + 7] == b"chd_ph\0"
    v.hash_keys_field = p + 7
    v.hash_state_len = p + 11
    state_len = struct.unpack("<I", v.data[p + 11:p + 15])[0]
    v.hash_state = p + 15
    assert v.data[v.hash_state:v.hash_state + 8] == b"jenkins\0"
    v.cs_len = v.hash_state + state_len
    cs_len = struct.unpack("<I", v.data[v.cs_len:v.cs_len + 4])[0]
    v.cs = v.cs_len + 4
    v.hash_n = v.cs + cs_len
    v.hash_nbuckets = v.hash_n + 4
    assert v.hash_nbuckets + 4 == v.extent
    assert struct.unpack("<I", v.data[v.hash_n:v.hash_n + 4])[0] == v.slots
    # chd_ph is not minimal: cmph records its range (the slot count) as "size"
    assert struct.unpack("<I", v.data[v.hash_keys_field:v.hash_keys_field + 4])[0] == v.slots
    return v


# ---------------------------------------------------------------- variants


def put(data, offset, raw):
    out = bytearray(data)
    out[offset:offset + len(raw)] = raw
    return bytes(out)


def set_field(name, value):
    i = HEADER_FIELDS.index(name)
    return lambda v: put(v.data, 32 + 8 * i, struct.pack(">Q", value(v) % 2**64))


def truncate(at):
    return lambda v: v.data[:at(v)]


def hash_u32(attr, value):
    return lambda v: put(v.data, getattr(v, attr), struct.pack("<I", value))


def hash_fill(fill):
    def mutate(v):
        p = v.header["hash_position"]
        n = v.extent - p
        raw = random.Random(5).randbytes(n) if fill is None else fill * n
        return put(v.data, p, raw)
    return mutate


def victim_slot_offset(value):
    def mutate(v):
        slot = v.header["index_position"] + 40 * v.victim_slot
        return put(v.data, slot + 32, struct.pack(">Q", value(v)))
    return mutate


def victim_size(value):
    return lambda v: put(v.data, v.victim_size_field, struct.pack(">Q", value(v)))


def garble_victim_key(attr):
    def mutate(v):
        slot = v.header["index_position"] + 40 * v.victim_slot
        return put(v.data, slot, getattr(v, attr))
    return mutate


H = lambda name: (lambda v: v.header[name])  # noqa: E731

VARIANTS = [
    # --- truncated at every section boundary and inside every section
    ("trunc-0", OPEN, truncate(lambda v: 0)),
    ("trunc-31", OPEN, truncate(lambda v: 31)),
    ("trunc-32", OPEN, truncate(lambda v: 32)),
    ("trunc-88", OPEN, truncate(lambda v: 88)),
    ("trunc-objects", OPEN, truncate(H("objects_position"))),
    ("trunc-mid-objects", OPEN,
     truncate(lambda v: v.header["objects_position"] + v.header["objects_size"] // 2)),
    ("trunc-index", OPEN, truncate(H("index_position"))),
    ("trunc-mid-index", OPEN,
     truncate(lambda v: v.header["index_position"] + v.header["index_size"] // 2 + 3)),
    ("trunc-hash", OPEN, truncate(H("hash_position"))),
    ("trunc-mid-hash", OPEN, truncate(lambda v: (v.header["hash_position"] + v.extent) // 2)),
    ("trunc-end-minus-1", OPEN, truncate(lambda v: v.extent - 1)),
    # --- magic
    ("magic", OPEN, lambda v: put(v.data, 0, b"SWHShart")),
    ("magic-zero", OPEN, lambda v: put(v.data, 0, bytes(32))),
    # --- version
    ("version-0", OPEN, set_field("version", lambda v: 0)),
    ("version-2", OPEN, set_field("version", lambda v: 2)),
    ("version-max", OPEN, set_field("version", lambda v: U64_MAX)),
    # --- objects_count
    ("objects_count-max", OPEN, set_field("objects_count", lambda v: U64_MAX)),
    ("objects_count-2^32", OPEN, set_field("objects_count", lambda v: 2**32)),
    ("objects_count-slots+1", OPEN, set_field("objects_count", lambda v: v.slots + 1)),
    ("objects_count-0", CHECK, set_field("objects_count", lambda v: 0)),
    # --- objects_position
    ("objects_position-0", OPEN, set_field("objects_position", lambda v: 0)),
    ("objects_position-in-header", OPEN, set_field("objects_position", lambda v: 87)),
    ("objects_position-max", OPEN, set_field("objects_position", lambda v: U64_MAX)),
    ("objects_position-2^63", OPEN, set_field("objects_position", lambda v: 2**63)),
    ("objects_position+1", OPEN,
     set_field("objects_position", lambda v: v.header["objects_position"] + 1)),
    ("objects_position-8", CHECK,
     set_field("objects_position", lambda v: v.header["objects_position"] - 8)),
    # --- objects_size
    ("objects_size-max", OPEN, set_field("objects_size", lambda v: U64_MAX)),
    ("objects_size-wraps", OPEN,
     set_field("objects_size", lambda v: 2**64 - v.header["objects_position"])),
    ("objects_size+1", OPEN, set_field("objects_size", lambda v: v.header["objects_size"] + 1)),
    ("objects_size-0", CHECK, set_field("objects_size", lambda v: 0)),
    ("objects_size-1", CHECK, set_field("objects_size", lambda v: v.header["objects_size"] - 1)),
    # --- index_position
    ("index_position-0", OPEN, set_field("index_position", lambda v: 0)),
    ("index_position-max", OPEN, set_field("index_position", lambda v: U64_MAX)),
    ("index_position-wraps", OPEN,
     set_field("index_position", lambda v: 2**64 - v.header["index_size"])),
    ("index_position+1", OPEN,
     set_field("index_position", lambda v: v.header["index_position"] + 1)),
    ("index_position-1", OPEN,
     set_field("index_position", lambda v: v.header["index_position"] - 1)),
    ("index_position+40", OPEN,
     set_field("index_position", lambda v: v.header["index_position"] + 40)),
    # --- index_size
    ("index_size-0", OPEN, set_field("index_size", lambda v: 0)),
    ("index_size-max", OPEN, set_field("index_size", lambda v: U64_MAX)),
    ("index_size-huge-multiple-of-40", OPEN, set_field("index_size", lambda v: 40 * 2**58)),
    ("index_size+1", OPEN, set_field("index_size", lambda v: v.header["index_size"] + 1)),
    ("index_size-40", OPEN, set_field("index_size", lambda v: v.header["index_size"] - 40)),
    ("index_size+40", OPEN, set_field("index_size", lambda v: v.header["index_size"] + 40)),
    # --- hash_position
    ("hash_position-0", OPEN, set_field("hash_position", lambda v: 0)),
    ("hash_position-max", OPEN, set_field("hash_position", lambda v: U64_MAX)),
    ("hash_position+1", OPEN, set_field("hash_position", lambda v: v.header["hash_position"] + 1)),
    ("hash_position-1", OPEN, set_field("hash_position", lambda v: v.header["hash_position"] - 1)),
    ("hash_position-at-end", OPEN, set_field("hash_position", lambda v: v.extent)),
    # --- hash section
    ("hash-random", OPEN, hash_fill(None)),
    ("hash-zeroed", OPEN, hash_fill(b"\0")),
    ("hash-ff", OPEN, hash_fill(b"\xff")),
    ("hash-algorithm-name", OPEN,
     lambda v: put(v.data, v.header["hash_position"], b"bdz_ph\0")),
    ("hash-function-name", OPEN, lambda v: put(v.data, v.hash_state, b"jenkinz\0")),
    ("hash-size-max", OPEN, hash_u32("hash_keys_field", U32_MAX)),
    ("hash-size-0", OPEN, hash_u32("hash_keys_field", 0)),
    ("hash-state-len-max", OPEN, hash_u32("hash_state_len", U32_MAX)),
    ("hash-state-len-0", OPEN, hash_u32("hash_state_len", 0)),
    ("hash-cs-len-max", OPEN, hash_u32("cs_len", U32_MAX)),
    ("hash-cs-len-0", OPEN, hash_u32("cs_len", 0)),
    ("hash-cs-n-max", OPEN, hash_u32("cs", U32_MAX)),
    ("hash-cs-rem-r-max", OPEN, lambda v: put(v.data, v.cs + 4, struct.pack("<I", U32_MAX))),
    ("hash-cs-total-length-max", OPEN,
     lambda v: put(v.data, v.cs + 8, struct.pack("<I", U32_MAX))),
    ("hash-n-0", OPEN, hash_u32("hash_n", 0)),
    ("hash-n-max", OPEN, hash_u32("hash_n", U32_MAX)),
    ("hash-n-plus-1", OPEN, lambda v: put(v.data, v.hash_n, struct.pack("<I", v.slots + 1))),
    ("hash-nbuckets-0", OPEN, hash_u32("hash_nbuckets", 0)),
    ("hash-nbuckets-max", OPEN, hash_u32("hash_nbuckets", U32_MAX)),
    # --- one slot, one object
    ("slot-offset-2^63", SLOT, victim_slot_offset(lambda v: 2**63)),
    ("slot-offset-max-1", SLOT, victim_slot_offset(lambda v: U64_MAX - 1)),
    ("slot-offset-0", SLOT, victim_slot_offset(lambda v: 0)),
    ("slot-offset-in-index", SLOT, victim_slot_offset(H("index_position"))),
    ("slot-offset-in-hash", SLOT, victim_slot_offset(H("hash_position"))),
    ("slot-offset-objects-end", SLOT,
     victim_slot_offset(lambda v: v.header["objects_position"] + v.header["objects_size"])),
    ("slot-offset-objects-end-minus-4", SLOT,
     victim_slot_offset(lambda v: v.header["objects_position"] + v.header["objects_size"] - 4)),
    ("size-2^62", SLOT, victim_size(lambda v: 2**62)),
    ("size-max", SLOT, victim_size(lambda v: U64_MAX)),
    ("size-past-objects-end", SLOT,
     victim_size(lambda v: v.header["objects_position"] + v.header["objects_size"]
                 - v.victim_size_field - 8 + 1)),
    ("slot-key-garbled", CHECK, garble_victim_key("garbled_elsewhere")),
    ("slot-key-garbled-same-slot", HASH, garble_victim_key("garbled_same_slot")),
]


# ------------------------------------------------------------------- probing

PROBE = r"""
import json, sys
import shardfs
path, keys = sys.argv[1], [bytes.fromhex(k) for k in sys.argv[2:]]
res = {}
def outcome(fn):
    try:
        return ["ok", fn()]
    except shardfs.CorruptShardError as e:
        return ["corrupt", str(e)]
    except KeyError as e:
        return ["notfound", str(e)]
    except Exception as e:
        return ["exc:" + type(e).__name__, str(e)]
try:
    s = shardfs.Shard(path)
except shardfs.CorruptShardError as e:
    res["open"] = ["corrupt", str(e)]
except Exception as e:
    res["open"] = ["exc:" + type(e).__name__, str(e)]
else:
    res["open"] = ["ok", None]
    res["lookup"] = {k.hex(): outcome(lambda: s[k].hex()) for k in keys}
    res["contains"] = {k.hex(): outcome(lambda: k in s) for k in keys}
    res["iter"] = outcome(lambda: len([k for k in s]))
    res["items_sizes"] = outcome(lambda: len(list(s.items_sizes())))
    res["len"] = outcome(lambda: len(s))
    res["check"] = outcome(lambda: s.check())
    res["check_hash"] = outcome(lambda: s.check(hash=True))
    s.close()
print(json.dumps(res))
"""

CLI_COMMANDS = {
    "info": ["info"],
    "ls": ["ls"],
    "get": ["get"],
    "check": ["check"],
    "check --hash": ["check", "--hash"],
}


def run_all(path, keys, get_key):
    """Start the API probe and the five CLI commands at once; wait for all.

    :returns: {name: (returncode, stdout bytes, stderr bytes)}; name "probe"
        or a CLI_COMMANDS key.
    """
    procs = {
        "probe": subprocess.Popen(
            [sys.executable, "-c", PROBE, str(path)] + [k.hex() for k in keys],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )
    }
    for name, argv in CLI_COMMANDS.items():
        extra = [get_key.hex()] if name == "get" else []
        procs[name] = subprocess.Popen(
            SHARDFS + argv + [str(path)] + extra,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )
    results = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=TIMEOUT)
            results[name] = (proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def check_cli(name, result, must_fail):
    code, out, err = result
    text = err.decode(errors="replace")
    assert code >= 0, f"{name}: killed by signal {-code}\n{text}"
    assert code in ((1,) if must_fail else (0, 1)), f"{name}: exit {code}\n{text}"
    assert "Traceback" not in text, f"{name}:\n{text}"
    if code == 1:
        lines = text.splitlines()
        assert len(lines) == 1 and lines[0].startswith("shardfs: "), f"{name}:\n{text}"
        assert "unexpected error" not in text, f"{name}: {text}"
    else:
        assert text == "", f"{name}:\n{text}"


@pytest.mark.parametrize("name,level,mutate", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_corrupt_variant(valid, tmp_path, name, level, mutate):
    data = mutate(valid)
    assert data != valid.data
    path = tmp_path / f"{name}.shard"
    path.write_bytes(data)
    keys = list(valid.objects)
    get_key = valid.victim
    results = run_all(path, keys, get_key)

    code, out, err = results["probe"]
    assert code == 0, f"API probe died (status {code}):\n{err.decode(errors='replace')}"
    probe = json.loads(out)
    opened, message = probe["open"]
    assert opened in ("ok", "corrupt"), f"Shard() raised {opened}: {message}"

    if level == OPEN:
        assert opened == "corrupt", "Shard() accepted a corrupt shard"
    if level == HASH:
        assert opened == "ok", f"the structure is sound, yet Shard() refused it: {message}"
    if opened == "corrupt":
        # Refused at open (any level that may be): the expected error all the same.
        assert str(path) in message, f"message does not name the file: {message}"
    else:
        # no operation may fail with anything but CorruptShardError/KeyError
        for what in ("iter", "items_sizes", "len", "check", "check_hash"):
            assert probe[what][0] in ("ok", "corrupt"), (what, probe[what])
        for table in ("lookup", "contains"):
            for key, (status, _) in probe[table].items():
                assert status in ("ok", "corrupt", "notfound"), (table, key, status)
        # check() must see the damage (or refuse with CorruptShardError)
        for what in ("check", "check_hash") if level != HASH else ("check_hash",):
            status, problems = probe[what]
            assert status == "corrupt" or problems, f"{what}() found nothing"
            if status == "ok":
                assert all(isinstance(p, str) and p for p in problems)
        if level == SLOT:
            status, _ = probe["lookup"][valid.victim.hex()]
            assert status in ("corrupt", "notfound"), "damaged object was returned"
            for key, content in valid.objects.items():
                if key != valid.victim:
                    assert probe["lookup"][key.hex()] == ["ok", content.hex()]

    for cli_name in CLI_COMMANDS:
        must_fail = (
            level in (OPEN, SLOT)
            or (level == CHECK and cli_name.startswith("check"))
            or (level == HASH and cli_name == "check --hash")
        )
        check_cli(cli_name, results[cli_name], must_fail)


def test_valid_shard_passes_everything(valid, tmp_path):
    """The baseline: the unmodified shard is accepted by the API and the CLI."""
    path = tmp_path / "valid.shard"
    path.write_bytes(valid.data)
    results = run_all(path, list(valid.objects), valid.victim)
    probe = json.loads(results["probe"][1])
    assert probe["open"][0] == "ok"
    assert probe["check"] == ["ok", []] and probe["check_hash"] == ["ok", []]
    for key, content in valid.objects.items():
        assert probe["lookup"][key.hex()] == ["ok", content.hex()]
    for cli_name in CLI_COMMANDS:
        code, out, err = results[cli_name]
        assert code == 0 and err == b"", (cli_name, err)
    assert results["get"][1] == valid.objects[valid.victim]


def test_larger_file_than_extent_is_fine(valid, tmp_path):
    """Extra bytes after the extent (an RBD image larger than the shard) are
    not corruption: the extent comes from the header."""
    path = tmp_path / "padded.shard"
    path.write_bytes(valid.data + b"\0" * 4096 + os.urandom(1000))
    with shardfs.Shard(str(path)) as s:
        assert s.extent == valid.extent
        assert s.check(hash=True) == []
        for key, content in valid.objects.items():
            assert s[key] == content


@pytest.mark.parametrize("key", ["", "00", "g" * 64, "0" * 63])
def test_bad_keys_api(valid, tmp_path, key):
    path = tmp_path / "valid.shard"
    path.write_bytes(valid.data)
    with shardfs.Shard(str(path)) as s:
        with pytest.raises(ValueError):
            s[key]
        with pytest.raises(ValueError):
            s.locate(key)


@pytest.mark.parametrize("kind", ["fifo", "directory", "char-device"])
def test_not_a_file(tmp_path, kind):
    """A FIFO, a directory or a character device given as the shard: a clean
    error, never a hang (opening a FIFO for reading blocks until a writer
    comes, unless opened with O_NONBLOCK)."""
    if kind == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    elif kind == "directory":
        path = tmp_path
    else:
        path = "/dev/zero"
    for argv in (["info"], ["ls"], ["check"], ["get", "0" * 64]):
        proc = subprocess.Popen(
            SHARDFS + argv[:1] + [str(path)] + argv[1:],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"shardfs {argv[0]} {kind}: still running after {TIMEOUT} s")
        check_cli(argv[0], (proc.returncode, out, err), must_fail=True)
        assert f"{path}: not a regular file or block device" in err.decode(), (argv[0], err)
    with pytest.raises(shardfs.ShardError, match="not a regular file or block device"):
        shardfs.Shard(str(path))


def test_error_of_a_path_not_utf8(tmp_path):
    """An error whose message holds a path that is not UTF-8 is still the
    error (the bytes replaced in the message), not a UnicodeDecodeError."""
    from shardfs import _shardfs

    missing = os.fsencode(tmp_path) + b"/\xff.shard"
    with pytest.raises(FileNotFoundError) as exc:
        _shardfs.Reader(missing)
    assert "\ufffd.shard" in str(exc.value)
