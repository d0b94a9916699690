"""End-to-end tests of the ``shardfs`` command line, run as subprocesses
(``python -m shardfs ...``) over real files in ``tmp_path``.

Conventions checked throughout: exit status 0 (success), 1 (failure), 2
(usage); an error is exactly one stderr line ``shardfs: <message>`` and never
a Python traceback.
"""

import argparse
import hashlib
import os
import pty
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shardfs
from shardfs import cli

SHARDFS = [sys.executable, "-m", "shardfs"]
TIMEOUT = 60  # seconds, per command


def run(*args, input=None, stdin=None, timeout=TIMEOUT):
    """Run ``shardfs ARGS...``; returns the CompletedProcess (bytes output)."""
    return subprocess.run(
        SHARDFS + [str(a) for a in args],
        input=input,
        stdin=stdin if input is None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=timeout,
    )


def assert_one_line_error(proc, status=1, contains=None):
    """The command failed with `status` and exactly one stderr line."""
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == status, (proc.returncode, err)
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("shardfs: "), err
    if contains is not None:
        assert contains in lines[0], err
    return lines[0]


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def ls_map(shard) -> dict:
    """``shardfs ls -l`` as {hex key: size in bytes}, checked against the
    plain ``shardfs ls`` (keys only, same order)."""
    plain = run("ls", shard)
    assert plain.returncode == 0, plain.stderr
    proc = run("ls", "-l", shard)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    out = {}
    for line in proc.stdout.decode().splitlines():
        key, size = line.split(" ")
        assert len(key) == 64 and key == key.lower()
        assert key not in out
        out[key] = int(size)
    assert plain.stdout.decode().split("\n")[:-1] == list(out)
    return out


def info_map(shard) -> dict:
    """``shardfs info`` as {name: value} (ints where they parse)."""
    proc = run("info", shard)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.decode().splitlines():
        name, _, value = line.partition(": ")
        out[name] = int(value) if value.isdigit() else value
    return out


@pytest.fixture
def tree(tmp_path):
    """A source tree with nested directories, duplicates, an empty file, a
    file larger than cli.SMALL_FILE (streamed), a symlink and a FIFO.

    Returns (source directory, {32-byte key: content} of the distinct
    regular files, number of duplicate files).
    """
    rng = random.Random(42)
    src = tmp_path / "src"
    (src / "sub" / "deeper").mkdir(parents=True)
    (src / "other").mkdir()
    files = {
        "a.txt": b"hello world\n",
        "sub/b.bin": rng.randbytes(3000),
        "sub/deeper/c.txt": b"hello world\n",  # duplicate of a.txt
        "sub/deeper/empty": b"",
        "other/empty-too": b"",  # duplicate of the empty file
        "other/big": rng.randbytes(cli.SMALL_FILE + 12345),
        "big-copy": None,  # duplicate of other/big, set below
        "sub/x": b"x",
    }
    files["big-copy"] = files["other/big"]
    for name, data in files.items():
        (src / name).write_bytes(data)
    os.symlink(src / "sub" / "x", src / "link-to-file")
    os.symlink(src / "sub", src / "other" / "link-to-dir")
    os.mkfifo(src / "fifo")
    contents = {sha256(d): d for d in files.values()}
    duplicates = len(files) - len(contents)
    return src, contents, duplicates


@pytest.fixture
def built(tree, tmp_path):
    """A shard created by the CLI from `tree`: (shard path, contents)."""
    src, contents, duplicates = tree
    shard = tmp_path / "t.shard"
    proc = run("create", shard, src)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert f"created {shard}: {len(contents)} objects" in out
    assert f"{duplicates} duplicates skipped" in out
    return shard, contents


# ------------------------------------------------------------------ create/ls/get


def test_create_ls_matches_sha256(built):
    shard, contents = built
    assert ls_map(shard) == {k.hex(): len(v) for k, v in contents.items()}


def test_create_skips_symlinks_and_special_files(tree, tmp_path):
    src, contents, _ = tree
    shard = tmp_path / "s.shard"
    proc = run("--debug", "create", shard, src)
    assert proc.returncode == 0
    err = proc.stderr.decode()
    assert "link-to-file" in err and "fifo" in err and "link-to-dir" in err
    assert set(ls_map(shard)) == {k.hex() for k in contents}


def test_create_from_files_and_dirs_mixed(tree, tmp_path):
    src, contents, _ = tree
    extra = tmp_path / "extra.txt"
    extra.write_bytes(b"extra")
    shard = tmp_path / "m.shard"
    proc = run("create", shard, extra, src / "sub", src / "a.txt")
    assert proc.returncode == 0, proc.stderr
    expected = {sha256(p.read_bytes()).hex() for p in [extra, src / "a.txt"]}
    expected |= {
        sha256(p.read_bytes()).hex()
        for p in (src / "sub").rglob("*")
        if p.is_file() and not p.is_symlink()
    }
    assert set(ls_map(shard)) == expected


# ------------------------------------------- create: the shard, object by object


def objects_in_order(shard) -> list:
    """The shard's live objects as ``(key, bytes)`` in the order they were
    written (by offset in the file), read through the ``Shard`` API."""
    with shardfs.Shard(shard) as s:
        found = sorted(s.scan(), key=lambda item: item[2])  # (slot, key, offset, size)
        return [(key, s[key]) for _slot, key, _offset, _size in found]


def walked_files(top: Path) -> list:
    """The regular files of ``top`` as create stored them before it read in
    threads: ``os.walk`` with sorted directories and files, an lstat each."""
    out = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink():
                out.append(path)
    return out


def file_by_file(shard: Path, paths) -> list:
    """A reference shard written by ShardWriter file after file, duplicates
    skipped; returns its objects_in_order."""
    with shardfs.ShardWriter(shard) as w:
        for path in paths:
            data = Path(path).read_bytes()
            if sha256(data) not in w:
                w.add(sha256(data), data)
    return objects_in_order(shard)


def test_create_gives_the_file_by_file_shard(tree, tmp_path):
    """Read and hashed in threads, the objects are the ones a writer fed file
    after file in walk order stores: same keys, same bytes, same order,
    duplicates once (including the streamed big file and its copy)."""
    src, contents, duplicates = tree
    extra = tmp_path / "extra.bin"
    extra.write_bytes(b"listed first")
    shard = tmp_path / "fast.shard"
    proc = run("create", shard, extra, src)
    assert proc.returncode == 0, proc.stderr
    assert f"{duplicates} duplicates skipped" in proc.stdout.decode()
    expected = file_by_file(tmp_path / "ref.shard", [extra] + walked_files(src))
    got = objects_in_order(shard)
    assert [k for k, _ in got] == [k for k, _ in expected]
    assert got == expected
    assert len(got) == len(contents) + 1
    assert any(len(data) > cli.SMALL_FILE for _, data in got)


def test_create_many_files_in_order(tmp_path):
    """Enough files for several batches and a full window of the writer's
    threads (thousands), with duplicates spread out: the same order as
    file after file."""
    rng = random.Random(7)
    src = tmp_path / "src"
    for d in range(12):
        (src / f"d{d:02}").mkdir(parents=True)
    pool = [rng.randbytes(rng.randint(0, 3000)) for _ in range(4000)]
    for i in range(6000):
        (src / f"d{i % 12:02}" / f"f{i:05}").write_bytes(pool[rng.randrange(len(pool))])
    shard = tmp_path / "many.shard"
    proc = run("create", shard, src)
    assert proc.returncode == 0, proc.stderr
    expected = file_by_file(tmp_path / "ref.shard", walked_files(src))
    assert objects_in_order(shard) == expected
    assert f"{6000 - len(expected)} duplicates skipped" in proc.stdout.decode()


def test_create_streams_large_files(tmp_path):
    """A file larger than SMALL_FILE is never held whole in memory: the peak
    resident set of the command stays well below the file's size. (Measured
    by a fresh interpreter between this one and the command, so that the
    command's peak does not start from pytest's.)"""
    src = tmp_path / "src"
    src.mkdir()
    chunk = random.Random(5).randbytes(1 << 20)
    h = hashlib.sha256()
    with open(src / "big", "wb") as f:
        for i in range(96):  # 96 MiB, each MiB different
            block = i.to_bytes(8, "little") + chunk[8:]
            f.write(block)
            h.update(block)
    (src / "small").write_bytes(b"small")
    shard = tmp_path / "big.shard"
    measure = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
               "stdout=subprocess.DEVNULL); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    proc = subprocess.run([sys.executable, "-c", measure] + SHARDFS + ["create", str(shard), str(src)],
                          capture_output=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    peak = int(proc.stdout) * 1024  # bytes
    assert peak < 64 << 20, peak
    with shardfs.Shard(shard) as s:
        assert sorted(s.keys()) == sorted([h.digest(), sha256(b"small")])
        assert sha256(s[h.digest()]) == h.digest()


def test_create_skips_special_files_named_or_found(tmp_path):
    """A FIFO (never opened for good: no hang) and a socket are skipped,
    inside a directory or named on the command line."""
    import socket

    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a")
    os.mkfifo(src / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "sock"))
    try:
        shard = tmp_path / "s.shard"
        proc = run("--debug", "create", shard, src, src / "fifo", src / "sock", timeout=20)
        assert proc.returncode == 0, proc.stderr
        err = proc.stderr.decode()
        assert err.count("fifo: not a regular file") == 2 and err.count("sock: not a regular file") == 2
        assert objects_in_order(shard) == [(sha256(b"a"), b"a")]
    finally:
        sock.close()


def test_create_missing_file_in_list_leaves_nothing(tree, tmp_path):
    """A listed path that is missing, or a dangling symbolic link named on
    the command line (followed), fails with one line naming it after other
    objects were written; no shard."""
    src, _, _ = tree
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    shard = tmp_path / "m.shard"
    listing = f"{src / 'a.txt'}\n{tmp_path / 'gone'}\n{src}\n".encode()
    proc = run("create", shard, "--files-from", "-", input=listing)
    assert_one_line_error(proc, 1, contains=f"{tmp_path / 'gone'}: No such file or directory")
    proc = run("create", shard, src / "a.txt", tmp_path / "dangling")
    assert_one_line_error(proc, 1, contains="dangling")
    assert leftovers(tmp_path, shard) == []


# ---------------------------------------------------------- create --files-from


@pytest.fixture
def listed(tmp_path):
    """Files whose names are awkward in a list (a space, a newline), their
    contents, in the order the tests list them."""
    src = tmp_path / "src"
    (src / "dir" / "sub").mkdir(parents=True)
    files = {
        src / "z last": b"z",
        src / "a first": b"a",
        src / "dir" / "sub" / "deep": b"deep",
        src / "dir" / "b": b"b",
        src / "dup": b"a",  # duplicate of "a first"
    }
    for path, data in files.items():
        path.write_bytes(data)
    return src, files


def test_files_from_newline_file_keeps_the_list_order(listed, tmp_path):
    src, files = listed
    listing = tmp_path / "list"
    # empty lines are skipped; the last name has no newline
    listing.write_bytes(f"{src / 'z last'}\n\n{src / 'a first'}\n{src / 'dup'}\n\n{src / 'dir'}".encode())
    shard = tmp_path / "l.shard"
    proc = run("create", shard, "--files-from", listing)
    assert proc.returncode == 0, proc.stderr
    assert "4 objects" in proc.stdout.decode() and "1 duplicates skipped" in proc.stdout.decode()
    # the listed directory is walked where it is listed, in sorted order
    assert [d for _, d in objects_in_order(shard)] == [b"z", b"a", b"b", b"deep"]


def test_files_from_stdin_nul_separated_with_paths(listed, tmp_path):
    """``find -print0 | shardfs create SHARD PATH --files-from - -0``: a
    name with a newline in it; PATHs first, then the list."""
    src, files = listed
    odd = src / "new\nline"
    odd.write_bytes(b"odd")
    listing = b"\0".join(os.fsencode(p) for p in [odd, src / "a first", src / "dir" / "b"]) + b"\0\0"
    shard = tmp_path / "n.shard"
    proc = run("create", shard, src / "z last", "--files-from", "-", "-0", input=listing)
    assert proc.returncode == 0, proc.stderr
    assert [d for _, d in objects_in_order(shard)] == [b"z", b"odd", b"a", b"b"]


def test_files_from_find_pipeline(listed, tmp_path):
    """The --help example, through a shell pipe: every file once."""
    src, files = listed
    shard = tmp_path / "f.shard"
    proc = subprocess.run(
        f"cd {src} && find . -type f -print0 | {' '.join(SHARDFS)} create {shard} --files-from - -0",
        shell=True, capture_output=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert dict(objects_in_order(shard)) == {sha256(d): d for d in files.values()}


def test_files_from_nul_in_a_line_is_a_usage_error(listed, tmp_path):
    src, _ = listed
    shard = tmp_path / "u.shard"
    proc = run("create", shard, "--files-from", "-", input=os.fsencode(src / "a first") + b"\0x\n")
    assert_one_line_error(proc, 2, contains="-0")
    assert leftovers(tmp_path, shard) == []


def test_files_from_missing_list_file(tmp_path):
    shard = tmp_path / "x.shard"
    assert_one_line_error(run("create", shard, "--files-from", tmp_path / "no-list"), 1,
                          contains="no-list")
    assert leftovers(tmp_path, shard) == []


def test_get_returns_exact_bytes(built):
    shard, contents = built
    for key, data in contents.items():
        proc = run("get", shard, key.hex())
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == data
        assert proc.stderr == b""
    # several keys: concatenated in the order given; upper case accepted
    keys = list(contents)
    proc = run("get", shard, *[k.hex().upper() for k in keys])
    assert proc.returncode == 0
    assert proc.stdout == b"".join(contents[k] for k in keys)


def test_get_missing_key_prints_found_ones_and_fails(built):
    shard, contents = built
    present = next(k for k, v in contents.items() if v)
    missing = sha256(b"not in the shard").hex()
    proc = run("get", shard, present.hex(), missing)
    assert proc.stdout == contents[present]
    line = assert_one_line_error(proc, 1)
    assert line == f"shardfs: {missing}: not found in {shard}"


def test_get_keys_from_stdin(built):
    """``shardfs ls | shardfs get SHARD -``: every object, in ls order; keys
    given before and after ``-`` keep their places."""
    shard, contents = built
    listing = run("ls", shard).stdout
    keys = [bytes.fromhex(k) for k in listing.decode().split()]
    proc = run("get", shard, "-", input=listing)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"".join(contents[k] for k in keys)
    first = keys[0].hex()
    proc = run("get", shard, first, "-", first, input=b"\n  " + keys[1].hex().encode() + b"  \n\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == contents[keys[0]] + contents[keys[1]] + contents[keys[0]]
    line = assert_one_line_error(run("get", shard, "-", input=listing + b"not-a-key\n"), 2)
    assert f"stdin line {len(keys) + 1}:" in line


def test_get_output_dir_writes_one_file_per_key(built, tmp_path):
    shard, contents = built
    listing = run("ls", shard).stdout
    missing = sha256(b"not in the shard").hex()
    out = tmp_path / "objects" / "here"  # created, parents too
    proc = run("get", shard, "-", missing, "-o", out, input=listing)
    line = assert_one_line_error(proc, 1)
    assert line == f"shardfs: {missing}: not found in {shard}"
    assert proc.stdout == b""
    files = {p.name: p for p in out.iterdir()}
    assert set(files) == {k.hex() for k in contents}  # no temporary file left
    for key, data in contents.items():
        path = files[key.hex()]
        assert path.read_bytes() == data and sha256(path.read_bytes()) == key
        assert path.stat().st_mode & 0o777 == 0o666 & ~cli._umask()
    # Again over the same files: replaced whole.
    assert run("get", shard, "-", "-o", out, input=listing).returncode == 0
    assert {p.name for p in out.iterdir()} == set(files)
    # DIR that is a file: one line, nothing written.
    assert_one_line_error(run("get", shard, "-", "-o", files[listing.split()[0].decode()], input=listing), 1)


def test_get_output_dir_write_error_leaves_no_partial_file(tmp_path):
    """A write error (EFBIG under RLIMIT_FSIZE, as a full disk would give):
    one line, exit 1, and no file under the key's name, whole or partial."""
    import resource

    big = random.Random(4).randbytes(200_000)
    small = b"small object"
    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(big)
    (src / "small").write_bytes(small)
    shard = tmp_path / "f.shard"
    assert run("create", shard, src).returncode == 0
    out = tmp_path / "out"

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, resource.RLIM_INFINITY))

    proc = subprocess.run(
        SHARDFS + ["get", str(shard), sha256(small).hex(), sha256(big).hex(), "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT, preexec_fn=limit,
    )
    assert_one_line_error(proc, 1)
    assert [p.name for p in out.iterdir()] == [sha256(small).hex()]
    assert (out / sha256(small).hex()).read_bytes() == small


@pytest.mark.parametrize("key", ["abc", "z" * 64, "0" * 63, "0" * 65, ""])
def test_get_bad_key_is_usage_error(built, key):
    shard, _ = built
    proc = run("get", shard, key)
    assert_one_line_error(proc, 2)
    assert proc.stdout == b""


def test_info_fields(built):
    shard, contents = built
    info = info_map(shard)
    n = len(contents)
    assert info["path"] == str(shard)
    assert info["version"] == 1
    assert info["objects_count"] == n
    assert info["objects_position"] == 512
    assert info["objects_size"] == sum(8 + len(v) for v in contents.values())
    assert info["index_position"] >= info["objects_position"] + info["objects_size"]
    assert info["index_size"] == 40 * info["slots"]
    assert info["slots"] >= n
    assert info["hash_position"] >= info["index_position"] + info["index_size"]
    assert info["live_objects"] == n
    assert info["object_bytes"] == sum(len(v) for v in contents.values())
    assert info["hash_size"] == info["extent"] - info["hash_position"] > 0
    assert info["extent"] <= os.path.getsize(shard)
    with shardfs.Shard(str(shard)) as s:
        assert tuple(s.header) == tuple(
            info[f]
            for f in (
                "version", "objects_count", "objects_position", "objects_size",
                "index_position", "index_size", "hash_position",
            )
        )
        assert s.extent == info["extent"]


# ------------------------------------------------------------------------- check


def test_check_ok(built):
    shard, contents = built
    for extra in ([], ["--hash"]):
        proc = run("check", *extra, shard)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.decode().startswith(f"{shard}: OK, {len(contents)} objects")
        assert proc.stderr == b""


def test_check_hash_detects_flipped_byte(built):
    shard, contents = built
    key = next(k for k, v in contents.items() if len(v) > 100)
    with shardfs.Shard(str(shard)) as s:
        data_offset, size = s.locate(key)
    assert size == len(contents[key])
    with open(shard, "r+b") as f:
        f.seek(data_offset + size // 2)
        byte = f.read(1)
        f.seek(data_offset + size // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    # the structure is intact...
    assert run("check", shard).returncode == 0
    # ...but the content no longer hashes to its key
    proc = run("check", "--hash", shard)
    assert_one_line_error(proc, 1, contains="check failed")
    assert key.hex() in proc.stdout.decode()
    assert "Traceback" not in proc.stdout.decode()


# ------------------------------------------------------------------------ delete


def test_delete_yes_removes_everywhere(built):
    shard, contents = built
    victim = next(k for k, v in contents.items() if len(v) > 100)
    proc = run("delete", "--yes", shard, victim.hex())
    assert proc.returncode == 0, proc.stderr
    listing = ls_map(shard)
    assert victim.hex() not in listing
    assert set(listing) == {k.hex() for k in contents} - {victim.hex()}
    assert_one_line_error(run("get", shard, victim.hex()), 1, contains="not found")
    with shardfs.Shard(str(shard)) as s:
        assert victim not in set(s)
        assert victim not in s
        assert len(s) == len(contents) - 1
        for key, data in contents.items():
            if key != victim:
                assert s[key] == data
    # the object's bytes are gone from the file
    assert contents[victim] not in shard.read_bytes()
    # a shard with a takedown is still a valid shard
    assert run("check", "--hash", shard).returncode == 0
    assert info_map(shard)["live_objects"] == len(contents) - 1
    # deleting it again: not found
    assert_one_line_error(run("delete", "--yes", shard, victim.hex()), 1, contains="not found")


def test_delete_several_and_repeated_keys(built):
    shard, contents = built
    victims = list(contents)[:2]
    hexes = [v.hex() for v in victims]
    proc = run("delete", "-y", shard, *hexes, hexes[0])
    assert proc.returncode == 0, proc.stderr
    assert set(ls_map(shard)) == {k.hex() for k in contents} - set(hexes)


def test_delete_missing_key_deletes_nothing(built):
    shard, contents = built
    present = next(iter(contents))
    missing = sha256(b"absent").hex()
    before = shard.read_bytes()
    proc = run("delete", "--yes", shard, present.hex(), missing)
    assert_one_line_error(proc, 1, contains=missing)
    assert shard.read_bytes() == before


def test_delete_refuses_without_yes_when_not_a_terminal(built):
    shard, contents = built
    before = shard.read_bytes()
    proc = run("delete", shard, next(iter(contents)).hex(), stdin=subprocess.DEVNULL)
    assert_one_line_error(
        proc, 2, contains="refusing to delete without --yes when stdin is not a terminal"
    )
    assert shard.read_bytes() == before


def test_delete_bad_key_is_usage_error(built):
    shard, _ = built
    assert_one_line_error(run("delete", "--yes", shard, "nope"), 2)


@pytest.mark.parametrize("answer,deleted", [(b"y\n", True), (b"n\n", False), (b"\n", False)])
def test_delete_asks_on_a_terminal(built, answer, deleted):
    shard, contents = built
    victim = next(iter(contents))
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            SHARDFS + ["delete", str(shard), victim.hex()],
            stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        os.close(slave)
        slave = None
        os.write(master, answer)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert victim.hex() in out.decode()  # the list shown before asking
    assert b"Traceback" not in err
    assert proc.returncode == (0 if deleted else 1)
    assert (victim.hex() in ls_map(shard)) is not deleted


# ------------------------------------------------------------------- edge shapes


def test_empty_shard_from_empty_dir(tmp_path):
    src = tmp_path / "empty"
    src.mkdir()
    shard = tmp_path / "e.shard"
    proc = run("create", shard, src)
    assert proc.returncode == 0, proc.stderr
    assert "0 objects" in proc.stdout.decode()
    assert ls_map(shard) == {}
    info = info_map(shard)
    assert info["objects_count"] == 0 and info["live_objects"] == 0
    assert info["object_bytes"] == 0
    for extra in ([], ["--hash"]):
        proc = run("check", *extra, shard)
        assert proc.returncode == 0, proc.stderr
        assert "OK, 0 objects" in proc.stdout.decode()
    assert_one_line_error(run("get", shard, sha256(b"").hex()), 1, contains="not found")
    with shardfs.Shard(str(shard)) as s:
        assert len(s) == 0 and list(s) == []


def test_one_object_shard(tmp_path):
    src = tmp_path / "one.txt"
    src.write_bytes(b"just one")
    shard = tmp_path / "1.shard"
    assert run("create", shard, src).returncode == 0
    key = sha256(b"just one").hex()
    assert ls_map(shard) == {key: 8}
    assert run("get", shard, key).stdout == b"just one"
    assert info_map(shard)["live_objects"] == 1
    assert run("check", "--hash", shard).returncode == 0


def test_empty_object(tmp_path):
    src = tmp_path / "zero"
    src.write_bytes(b"")
    shard = tmp_path / "z.shard"
    assert run("create", shard, src).returncode == 0
    key = sha256(b"").hex()
    assert ls_map(shard) == {key: 0}
    proc = run("get", shard, key)
    assert proc.returncode == 0 and proc.stdout == b"" and proc.stderr == b""
    assert run("check", "--hash", shard).returncode == 0
    proc = run("delete", "--yes", shard, key)
    assert proc.returncode == 0, proc.stderr
    assert ls_map(shard) == {}


# ------------------------------------------------------------ create failures


def leftovers(directory: Path, shard: Path):
    """Files next to `shard` that the writer may have left (temporaries)."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(shard.name))


def test_create_nonexistent_source_leaves_nothing(tree, tmp_path):
    src, _, _ = tree
    shard = tmp_path / "n.shard"
    proc = run("create", shard, src, tmp_path / "does-not-exist")
    assert_one_line_error(proc, 1, contains="does-not-exist")
    assert leftovers(tmp_path, shard) == []


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs /proc/self/mem")
def test_create_read_error_midway_leaves_nothing(tree, tmp_path):
    # /proc/self/mem is a regular file whose read at offset 0 fails with EIO:
    # a genuine read error after the writer has already stored objects.
    src, _, _ = tree
    shard = tmp_path / "r.shard"
    proc = run("create", shard, src, "/proc/self/mem")
    assert_one_line_error(proc, 1, contains="/proc/self/mem")
    assert leftovers(tmp_path, shard) == []


def test_create_refuses_to_overwrite_without_force(tree, tmp_path):
    src, contents, _ = tree
    shard = tmp_path / "x.shard"
    shard.write_bytes(b"precious")
    assert_one_line_error(run("create", shard, src), 1, contains="already exists")
    assert shard.read_bytes() == b"precious"
    proc = run("create", "--force", shard, src)
    assert proc.returncode == 0, proc.stderr
    assert set(ls_map(shard)) == {k.hex() for k in contents}


def test_create_shard_inside_its_source_dir(tmp_path):
    """The writer's temporary file (created beside SHARD before the walk) and
    the shard being replaced are not stored in the new shard. No empty file
    in the source: an empty temporary file would pass for a duplicate."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    contents = {}
    for i, name in enumerate(["a", "d/b", "z"]):
        data = f"content {i}".encode() * 100
        (src / name).write_bytes(data)
        contents[sha256(data).hex()] = len(data)
    shard = src / "inside.shard"
    assert run("create", shard, src).returncode == 0
    assert ls_map(shard) == contents
    # again with --force: the old shard is not stored in the new one
    assert run("create", "--force", shard, src).returncode == 0
    assert ls_map(shard) == contents
    assert sorted(p.name for p in src.iterdir()) == ["a", "d", "inside.shard", "z"]


def test_create_into_missing_directory(tree, tmp_path):
    src, _, _ = tree
    shard = tmp_path / "no" / "such" / "dir" / "s.shard"
    assert_one_line_error(run("create", shard, src), 1)


def test_ctrl_c_during_create_leaves_nothing(tree, tmp_path, monkeypatch, capsys):
    # Ctrl-C while create walks a directory, after a first object was written
    src, _, _ = tree
    shard = tmp_path / "c.shard"
    written = []

    def interrupted(top, excluder=None):
        written.append(len(writers[0]))
        raise KeyboardInterrupt
        yield  # a generator, as walk_files

    writers = []
    real_writer = shardfs.ShardWriter

    def writer(path):
        writers.append(real_writer(path))
        return writers[-1]

    monkeypatch.setattr(cli, "walk_files", interrupted)
    monkeypatch.setattr(shardfs, "ShardWriter", writer)
    assert cli.main(["create", str(shard), str(src / "a.txt"), str(src)]) == 130
    assert written == [1]
    err = capsys.readouterr().err
    assert err.strip() == "shardfs: interrupted"
    assert leftovers(tmp_path, shard) == []


# -------------------------------------------------------- errors, usage, help


@pytest.mark.parametrize("command", ["info", "ls", "check"])
def test_missing_shard_file(tmp_path, command):
    proc = run(command, tmp_path / "nope.shard")
    assert_one_line_error(proc, 1, contains="nope.shard")


@pytest.mark.parametrize("command", ["info", "ls", "check"])
def test_not_a_shard(tmp_path, command):
    path = tmp_path / "text"
    path.write_bytes(b"this is not a shard\n" * 100)
    assert_one_line_error(run(command, path), 1)


def test_directory_as_shard(tmp_path):
    assert_one_line_error(run("info", tmp_path), 1)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["info"],
        ["get", "x.shard"],
        ["create", "x.shard"],
        ["check", "--bogus", "x.shard"],
        ["mount", "only-one-argument"],
    ],
)
def test_usage_errors(argv):
    assert_one_line_error(run(*argv), 2)


def _parser_commands() -> list:
    """The subcommands, from the command line's own argparse parser."""
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


COMMANDS = _parser_commands()


@pytest.mark.parametrize("command", [None] + COMMANDS)
def test_help(command):
    argv = ["--help"] if command is None else [command, "--help"]
    proc = run(*argv)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert out.startswith("usage: shardfs")
    assert "examples:" in out
    if command is None:
        # Every command listed once, in order, with its one-line help.
        listed = re.findall(r"^    ([a-z-]+) {2,}\S", out, re.MULTILINE)
        assert listed == COMMANDS, out


def test_version():
    proc = run("--version")
    assert proc.returncode == 0
    assert proc.stdout.decode().startswith("shardfs ")


def test_debug_shows_traceback(tmp_path):
    proc = run("--debug", "info", tmp_path / "nope.shard")
    assert proc.returncode == 1
    assert b"Traceback" in proc.stderr
    # --debug is accepted after the command name too
    proc = run("info", "--debug", tmp_path / "nope.shard")
    assert proc.returncode == 1 and b"Traceback" in proc.stderr


def test_ls_into_a_closed_pipe(tmp_path):
    """``shardfs ls X | head -1``: quiet exit once the reader is gone."""
    shard = tmp_path / "many.shard"
    with shardfs.ShardWriter(str(shard)) as w:
        for i in range(5000):
            data = str(i).encode()
            w.add(sha256(data), data)
    proc = subprocess.Popen(
        SHARDFS + ["ls", str(shard)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    first = proc.stdout.readline()
    assert len(first.strip()) == 64
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=TIMEOUT)
    proc.stderr.close()
    assert err == b""
    assert proc.returncode == cli.EXIT_BROKEN_PIPE


# ---------------------------------------------------------------- in process


def test_main_in_process(built, capsys):
    shard, contents = built
    assert cli.main(["ls", str(shard)]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == len(contents)
    assert cli.main(["info", str(shard) + ".missing"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert cli.main(["get", str(shard), "xyz"]) == 2
    assert cli.main(["--help"]) == 0


def test_format_size():
    assert cli.format_size(0) == "0 B"
    assert cli.format_size(999) == "999 B"
    assert cli.format_size(1000) == "1.0 kB"
    assert cli.format_size(56_700_000) == "56.7 MB"
    assert cli.format_size(10**18) == "1000.0 PB"


def test_progress_bar_on_a_terminal(tree, tmp_path):
    """With stderr on a terminal, create and check --hash draw a progress bar
    there; stdout keeps the one summary line."""
    src, contents, _ = tree
    shard = tmp_path / "tty.shard"
    for argv in (["create", str(shard), str(src)], ["check", "--hash", str(shard)]):
        master, slave = pty.openpty()
        try:
            proc = subprocess.Popen(
                SHARDFS + argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave
            )
            os.close(slave)
            slave = None
            out = proc.communicate(timeout=TIMEOUT)[0]
            drawn = b""
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                drawn += chunk
        finally:
            if slave is not None:
                os.close(slave)
            os.close(master)
        assert proc.returncode == 0, drawn
        assert len(out.decode().splitlines()) == 1
        assert b"Traceback" not in drawn
        assert b"100%" in drawn, drawn
    assert set(ls_map(shard)) == {k.hex() for k in contents}


def _fuse_importable():
    try:
        from shardfs.fuse import mount  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _fuse_importable(), reason="shardfs.fuse not importable")
def test_mount_and_umount_errors(built, tmp_path):
    shard, _ = built
    mp = tmp_path / "mp"
    mp.mkdir()
    assert_one_line_error(run("mount", tmp_path / "missing.shard", mp), 1)
    assert_one_line_error(run("mount", shard, tmp_path / "no-such-dir"), 1)
    bad = tmp_path / "bad.shard"
    bad.write_bytes(b"not a shard" * 100)
    assert_one_line_error(run("mount", bad, mp), 1)
    assert_one_line_error(run("umount", mp), 1)
    assert not os.path.ismount(mp)


@pytest.mark.parametrize("big", [False, True], ids=["add", "add_file"])
def test_create_file_too_large_leaves_nothing(tmp_path, big):
    """A write error in the writer (EFBIG under RLIMIT_FSIZE, like ENOSPC)
    fails the command with one line and removes the temporary file."""
    import resource

    src = tmp_path / "src"
    src.mkdir()
    size = cli.SMALL_FILE + 1000 if big else 100_000
    (src / "blob").write_bytes(random.Random(3).randbytes(size))
    (src / "small").write_bytes(b"small")
    out = tmp_path / "out"
    out.mkdir()
    shard = out / "f.shard"

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, resource.RLIM_INFINITY))

    proc = subprocess.run(
        SHARDFS + ["create", str(shard), str(src)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT, preexec_fn=limit,
    )
    assert_one_line_error(proc, 1)
    assert list(out.iterdir()) == []


def test_mistyped_command_is_not_taken_for_a_mount(built, tmp_path):
    """Only ``shardfs SOURCE MOUNTPOINT -o OPTIONS`` with an existing
    SOURCE is the mount helper form; a typo is a usage error, and nothing
    is mounted."""
    shard, _ = built
    for argv in (["crate", str(shard), str(tmp_path)], [str(shard), str(tmp_path)],
                 ["/no/such/shard", str(tmp_path), "-o", "ro"]):
        proc = run(*argv)
        assert proc.returncode == cli.EXIT_USAGE, argv
        assert b"invalid choice" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not os.path.ismount(tmp_path)
