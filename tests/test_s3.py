"""Read Shards kept as objects of an S3 bucket (``s3://BUCKET/KEY``) on a
real S3 server: Ceph's radosgw, started by the tests on the single-host
cluster of tests/ceph_cluster.py, its bucket filled by uploads as the AWS
SDK makes them (boto3). Every object read by the API, the command line and
a mount is compared with the files the shard was made from; an object
replaced under its key gives ESTALE, never another object's bytes; a
stopped or killed server gives an error within the configured timeout,
never a hang."""
from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ceph_cluster import S3_ACCESS_KEY, S3_SECRET_KEY, CephCluster, rgw_available
from mounting import SHARDFS, files_by_key, run

pytestmark = pytest.mark.skipif(not rgw_available(), reason="Ceph's radosgw is not installed (make test installs it)")

SOURCES = ["/usr/share/common-licenses", "/usr/share/doc/bash"]
BUCKET = "shards"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """(cluster, endpoint, boto3 client, env for shardfs) with a bucket
    BUCKET holding docs.shard as "dir/docs.shard"; {key: path} of its
    objects."""
    import boto3

    work = tmp_path_factory.mktemp("s3")
    with CephCluster(work) as cluster:
        endpoint = cluster.start_rgw()
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=S3_ACCESS_KEY,
                              aws_secret_access_key=S3_SECRET_KEY, region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        shard = work / "docs.shard"
        run(SHARDFS + ["create", shard, *SOURCES], check=True)
        client.upload_file(str(shard), BUCKET, "dir/docs.shard")
        env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=S3_ACCESS_KEY,
                   AWS_SECRET_ACCESS_KEY=S3_SECRET_KEY, AWS_REGION="us-east-1",
                   SHARDFS_CACHE_DIR=str(work / "cache"))
        yield cluster, endpoint, client, env, shard


def _files() -> dict:
    return files_by_key(SOURCES)


def _python(env: dict, code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`code` in a child Python with `env` (the S3 settings are per process)."""
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_api_reads_every_object_of_a_shard_in_s3(s3, tmp_path):
    """`shardfs.Shard("s3://BUCKET/KEY")`: its local copy made at the first
    open (one per ETag and size), every object right by get and get_batch,
    absent keys absent, the copy reused by a second open."""
    cluster, endpoint, client, env, shard = s3
    files = _files()
    code = """
import hashlib, json, os, sys, time
from shardfs.shard import Shard
from shardfs import s3
s3.configure(cache_dir=os.environ["SHARDFS_CACHE_DIR"])
files = json.loads(sys.argv[1])
t = time.monotonic()
with Shard("s3://shards/dir/docs.shard") as sh:
    first = time.monotonic() - t
    assert sh.kind == "s3", sh.kind
    assert len(sh) == len(files)
    for key, path in files.items():
        assert sh[bytes.fromhex(key)] == open(path, "rb").read(), key
    keys = [bytes.fromhex(k) for k in files]
    assert sh.get_batch(keys + [b"\\0" * 32]) == [open(files[k.hex()], "rb").read() for k in keys] + [None]
    assert b"\\1" * 32 not in sh
t = time.monotonic()
with Shard("s3://shards/dir/docs.shard") as sh:
    again = time.monotonic() - t
copies = [n for _, _, names in os.walk(os.environ["SHARDFS_CACHE_DIR"]) for n in names if n.endswith(".copy")]
print(json.dumps({"copies": copies, "first": first, "again": again}))
"""
    import json

    proc = _python(env, code, json.dumps(files))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    etag = client.head_object(Bucket=BUCKET, Key="dir/docs.shard")["ETag"].strip('"')
    assert len(out["copies"]) == 1 and etag in out["copies"][0], out


def test_cli_and_mount_read_a_shard_in_s3(s3, tmp_path, mounter):
    """`shardfs info`, `ls`, `get` and `check` take an s3:// source; a
    mount of it serves every object, sha256sum-clean."""
    cluster, endpoint, client, env, shard = s3
    files = _files()
    source = f"s3://{BUCKET}/dir/docs.shard"
    info = subprocess.run(SHARDFS + ["info", source], env=env, capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert f"live_objects: {len(files)}" in info.stdout
    keys = subprocess.run(SHARDFS + ["ls", source], env=env, capture_output=True, text=True, timeout=120)
    assert sorted(keys.stdout.split()) == sorted(files)
    out = tmp_path / "out"
    got = subprocess.run(SHARDFS + ["get", source, *list(files)[:20], "-o", str(out)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    for key in list(files)[:20]:
        assert (out / key).read_bytes() == Path(files[key]).read_bytes()
    check = subprocess.run(SHARDFS + ["check", "--hash", source], env=env, capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 0 and "OK" in check.stdout, check.stdout + check.stderr
    point = tmp_path / "m"
    mounter._claim(point)
    proc = subprocess.run(SHARDFS + ["mount", "--layout", "flat", "--cache-dir", env["SHARDFS_CACHE_DIR"], source,
                                     str(point)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    sums = run(["sha256sum", *files], cwd=point, check=True).stdout.split("\n")
    assert sum(1 for line in sums if line and line.split()[0] == line.split()[1]) == len(files)


def test_replaced_object_gives_estale_never_other_bytes(s3, tmp_path):
    """An object replaced under its key after it was opened: reads fail
    with ESTALE (every GET asks for the copied ETag); a new open makes a
    copy of the new object and reads it."""
    cluster, endpoint, client, env, shard = s3
    other = tmp_path / "other.shard"
    run(SHARDFS + ["create", other, "/usr/share/doc/bash"], check=True)
    client.upload_file(str(shard), BUCKET, "swap.shard")
    code = """
import errno, os, sys
from shardfs.shard import Shard
from shardfs import s3
s3.configure(cache_dir=os.environ["SHARDFS_CACHE_DIR"])
sh = Shard("s3://shards/swap.shard")
key = next(iter(sh.keys()))
before = sh[key]
print("opened", flush=True)
sys.stdin.readline()
try:
    sh[key]
    print("read")
except OSError as exc:
    print("errno", exc.errno)
with Shard("s3://shards/swap.shard") as again:
    print("reopened", len(again))
"""
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "opened", child.stderr.read()
        client.upload_file(str(other), BUCKET, "swap.shard")
        out, err = child.communicate("go\n", timeout=120)
    finally:
        child.kill()
    lines = out.split("\n")
    assert lines[0] == f"errno {errno.ESTALE}", out + err
    n = subprocess.run(SHARDFS + ["info", str(other)], capture_output=True, text=True).stdout
    assert lines[1] == f"reopened {[int(x.split()[1]) for x in n.splitlines() if x.startswith('live_objects:')][0]}"


#: A child reader of dir/docs.shard (S3 timeout 2 s): its local copy made,
#: it prints "opened"; at a line on stdin it reads one object and prints
#: "read SECONDS" or "errno N SECONDS"; at the next it reads another and
#: prints "after" and whether those bytes hash to their key.
_OUTAGE_READER = """
import hashlib, os, sys, time
from shardfs.shard import Shard
from shardfs import s3
s3.configure(cache_dir=os.environ["SHARDFS_CACHE_DIR"], timeout=2)
sh = Shard("s3://shards/dir/docs.shard")
keys = list(sh.keys())
print("opened", flush=True)
sys.stdin.readline()
t = time.monotonic()
try:
    sh[keys[0]]
    print("read", time.monotonic() - t)
except OSError as exc:
    print("errno", exc.errno, time.monotonic() - t)
sys.stdin.readline()
print("after", hashlib.sha256(sh[keys[1]]).digest() == keys[1])
"""


def _read_across(env: dict, outage) -> tuple:
    """Run _OUTAGE_READER, its first read made inside `outage` (a context
    manager: the server's fault), its second after: (the first answer's
    fields, the rest of its stdout, its stderr)."""
    child = subprocess.Popen([sys.executable, "-c", _OUTAGE_READER], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "opened", child.stderr.read()
        with outage:
            child.stdin.write("go\n")
            child.stdin.flush()
            line = child.stdout.readline().split()
        out, err = child.communicate("go\n", timeout=60)
    finally:
        child.kill()
    return line, out, err


@contextlib.contextmanager
def _killed_rgw(cluster, endpoint: str):
    """radosgw killed (SIGKILL) for the block, then a new one started on the
    same port."""
    port = int(endpoint.rsplit(":", 1)[1])
    cluster.kill("rgw")
    try:
        yield
    finally:
        cluster.start_rgw(port)


def test_stopped_server_gives_an_error_within_the_timeout(s3, tmp_path):
    """radosgw stopped (SIGSTOP: it answers nothing) under a reader whose
    local copy is made: a read fails with ETIMEDOUT within the configured
    timeout (2 s here), never hangs; once the server resumes, reads work."""
    cluster, endpoint, client, env, shard = s3
    line, out, err = _read_across(env, cluster.paused("rgw"))
    assert line[0] == "errno" and int(line[1]) == errno.ETIMEDOUT and float(line[2]) < 5, (line, err)
    assert out.strip() == "after True", err


def test_killed_server_gives_an_error_at_once_under_the_api(s3, tmp_path):
    """radosgw killed under a reader whose local copy is made (API, a Read
    Shard in S3): a read fails with an OSError at once
    (connection refused), never hangs nor gives bytes; once a new radosgw
    listens on the same port, the same reader reads again."""
    cluster, endpoint, client, env, shard = s3
    line, out, err = _read_across(env, _killed_rgw(cluster, endpoint))
    assert line[0] == "errno" and float(line[2]) < 2, (line, err)
    assert out.strip() == "after True", err


def test_mount_follows_a_bucket_prefix(s3, tmp_path, mounter):
    """``--shard-dir s3://BUCKET/PREFIX``: the shards under the prefix are
    served (whatever their names), listed again every few seconds: an
    object uploaded is served, one deleted goes, one replaced under its
    key serves its new objects; objects elsewhere in the bucket are not."""
    from mounting import build_shard, make_blobs, wait_until

    cluster, endpoint, client, env, shard = s3
    blobs = {name: build_shard(tmp_path / f"{name}.shard", make_blobs(seed, 30, 1, 3000, tag=name.encode()))
             for seed, name in enumerate(("a", "b", "c", "d"), 1)}
    for name in ("a", "b"):
        client.upload_file(str(tmp_path / f"{name}.shard"), BUCKET, f"pool/{name}")
    client.upload_file(str(tmp_path / "d.shard"), BUCKET, "elsewhere/d")
    point = tmp_path / "m"
    mounter._claim(point)
    proc = subprocess.run(SHARDFS + ["mount", "--layout", "flat", "--cache-dir", env["SHARDFS_CACHE_DIR"],
                                     "--shard-dir", f"s3://{BUCKET}/pool", str(point)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr

    def serves(objects):
        try:
            return all((point / key).read_bytes() == data for key, data in objects.items())
        except OSError:
            return False

    def absent(objects):
        return not any((point / key).exists() for key in objects)

    assert serves(blobs["a"]) and serves(blobs["b"]) and absent(blobs["d"])
    client.upload_file(str(tmp_path / "c.shard"), BUCKET, "pool/c")
    assert wait_until(lambda: serves(blobs["c"]), timeout=30), "an uploaded shard is not served"
    client.delete_object(Bucket=BUCKET, Key="pool/b")
    assert wait_until(lambda: absent(blobs["b"]), timeout=30), "a deleted shard is still served"
    client.upload_file(str(tmp_path / "d.shard"), BUCKET, "pool/a")  # a replaced under its key
    assert wait_until(lambda: serves(blobs["d"]) and absent(blobs["a"]), timeout=30), \
        "a replaced shard is not followed"


def test_forked_processes_never_share_a_connection(s3):
    """A shard opened and read in a process that then forks (as a mount's
    coordinator forks its workers): parent and child read the objects at
    once, many times; every byte right (each process makes its own
    connections: the kept-alive ones of the parent are never used by the
    child, where two processes on one socket read each other's answers)."""
    cluster, endpoint, client, env, shard = s3
    code = """
import os, sys
from shardfs.shard import Shard
from shardfs import s3
s3.configure(cache_dir=os.environ["SHARDFS_CACHE_DIR"])
sh = Shard("s3://shards/dir/docs.shard")
want = {k: sh[k] for k in sh.keys()}  # connections kept alive in this process
pid = os.fork()
bad = 0
for _ in range(15):
    for k, data in want.items():
        bad += sh[k] != data
if pid == 0:
    os._exit(1 if bad else 0)
_, status = os.waitpid(pid, 0)
print(bad, os.waitstatus_to_exitcode(status))
"""
    proc = _python(env, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "0"], proc.stdout


def test_objstorage_reads_shards_in_s3(s3):
    """swh's objstorage interface (`cls: shardfs`) over ``shard_dir:
    s3://BUCKET/PREFIX`` with its ``s3: {endpoint, timeout}`` settings:
    every object by its sha256, an absent one ObjNotFoundError."""
    cluster, endpoint, client, env, shard = s3
    client.upload_file(str(shard), BUCKET, "store/docs.shard")
    code = """
import hashlib, json, os, sys
from swh.objstorage.exc import ObjNotFoundError
from swh.objstorage.factory import get_objstorage
files = json.loads(sys.argv[1])
env = dict(os.environ)
endpoint = os.environ.pop("AWS_ENDPOINT_URL")  # given by the configuration instead
storage = get_objstorage("shardfs", shard_dir="s3://shards/store", cache_dir=env["SHARDFS_CACHE_DIR"],
                         s3={"endpoint": endpoint, "timeout": 10})
for key, path in files.items():
    assert storage.get({"sha256": bytes.fromhex(key)}) == open(path, "rb").read(), key
try:
    storage.get({"sha256": b"\\1" * 32})
    print("found")
except ObjNotFoundError:
    print("ok", len(files))
"""
    import json

    proc = _python(env, code, json.dumps(_files()))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ok {len(_files())}"


def test_anonymous_reads_of_a_public_bucket(s3, tmp_path):
    """A bucket readable by anyone: with no keys (and with
    AWS_SKIP_SIGNATURE=true beside keys), requests go unsigned and every
    object is read."""
    cluster, endpoint, client, env, shard = s3
    client.create_bucket(Bucket="public", ACL="public-read")
    client.upload_file(str(shard), "public", "docs.shard", ExtraArgs={"ACL": "public-read"})
    code = """
import json, os, sys
from shardfs.shard import Shard
from shardfs import s3
s3.configure(cache_dir=os.environ["SHARDFS_CACHE_DIR"])
files = json.loads(sys.argv[1])
with Shard("s3://public/docs.shard") as sh:
    print(sum(sh[bytes.fromhex(k)] == open(p, "rb").read() for k, p in files.items()))
"""
    import json

    files = _files()
    anonymous = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    for e in (anonymous, dict(env, AWS_SKIP_SIGNATURE="true")):
        proc = _python(e, code, json.dumps(files))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == str(len(files))
    proc = _python(anonymous, code.replace("s3://public/", "s3://shards/dir/"), json.dumps(files))
    assert proc.returncode != 0 and "403" in proc.stderr  # a private bucket refuses unsigned requests


def test_server_stopped_then_killed_under_a_mount(s3, tmp_path, mounter):
    """radosgw stopped (SIGSTOP) under a mount (-o s3_endpoint=, s3_timeout=2;
    no AWS_ENDPOINT_URL): a cold object fails with EIO within the timeout,
    names still answer (the local copy), and reads work once it resumes;
    then killed: EIO at once (connection refused), and once a new radosgw
    listens on the same port, reads work again. Never a hang."""
    cluster, endpoint, client, env, shard = s3
    files = _files()
    env = {k: v for k, v in env.items() if k not in ("AWS_ENDPOINT_URL",)}
    point = tmp_path / "m"
    mounter._claim(point)
    proc = subprocess.run(SHARDFS + ["mount", "--layout", "flat", "--cache-dir", env["SHARDFS_CACHE_DIR"],
                                     "-o", f"s3_endpoint={endpoint},s3_timeout=2", f"s3://{BUCKET}/dir/docs.shard",
                                     str(point)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    keys = list(files)
    assert (point / keys[0]).read_bytes() == Path(files[keys[0]]).read_bytes()

    def read_fails(key: str, within: float) -> None:
        started = time.monotonic()
        with pytest.raises(OSError) as failed:
            (point / key).read_bytes()
        assert failed.value.errno == errno.EIO and time.monotonic() - started < within

    with cluster.paused("rgw"):
        assert os.stat(point / keys[1]).st_size == os.path.getsize(files[keys[1]])  # from the local copy
        read_fails(keys[1], 10)
    assert (point / keys[1]).read_bytes() == Path(files[keys[1]]).read_bytes()
    port = int(endpoint.rsplit(":", 1)[1])
    cluster.kill("rgw")
    read_fails(keys[2], 5)
    cluster.start_rgw(port)
    assert (point / keys[2]).read_bytes() == Path(files[keys[2]]).read_bytes()


def test_mosaic_files_in_s3(s3, tmp_path, mounter):
    """MOSAIC files written by swh.mosaic (raw, zstd, zstd with a
    dictionary, some objects deleted), uploaded to the bucket: read as
    shards by the API (every object as swh's reader gives it, deleted and
    absent keys absent, a second open from the local copy) and through a
    ``--shard-dir s3://`` mount beside a Read Shard (sha256sum of every
    file)."""
    cluster, endpoint, client, env, shard = s3
    fixtures = tmp_path / "fixtures"
    subprocess.run([sys.executable, str(Path(__file__).with_name("mosaic_fixtures.py")), str(fixtures), "--objects",
                    "200"], check=True, capture_output=True, timeout=600)
    expected, per_file = {}, {}
    for name in ("raw", "zstd", "zstd_dict", "deleted_zstd"):
        client.upload_file(str(fixtures / f"{name}.mosaic"), BUCKET, f"mosaic/{name}")
        lines = (fixtures / f"{name}.mosaic.manifest").read_text().splitlines()
        names = next(line.split()[1:] for line in lines if line.startswith("indexes "))
        at = names.index("sha256")
        for line in lines:
            f = line.split()
            if f[0] == "O":
                expected[f[1 + at]] = f[len(names) + 2]
                per_file[name] = per_file.get(name, 0) + 1
            elif f[0] == "D":
                expected.setdefault("deleted", []).append(f[1 + at])
    deleted = expected.pop("deleted")
    client.upload_file(str(shard), BUCKET, "mosaic/docs.shard")
    code = """
import hashlib, json, os, sys
from shardfs.shard import Shard
from shardfs import s3
s3.configure(cache_dir=os.environ["SHARDFS_CACHE_DIR"])
expected, deleted = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ok = 0
for name in ("raw", "zstd", "zstd_dict", "deleted_zstd", "raw"):
    with Shard("s3://shards/mosaic/" + name) as sh:
        assert sh.kind == "mosaic", sh.kind
        for key in sh.keys():
            data = sh[key]
            ok += hashlib.sha256(data).hexdigest() == expected[key.hex()]
            if len(data) > 10:
                off, size = sh.locate(key)
                assert sh.pread(off, size, 3, 5) == data[3:8]
        assert not any(bytes.fromhex(k) in sh for k in deleted)
        keys = list(sh.keys())
        assert sh.get_batch(keys + [b"\\0" * 32]) == [sh[k] for k in keys] + [None]  # GETs in flight at once
print(ok)
"""
    import json

    proc = _python(env, code, json.dumps(expected), json.dumps(deleted))
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == sum(per_file.values()) + per_file["raw"]  # raw opened twice: from its copy
    point = tmp_path / "m"
    mounter._claim(point)
    proc = subprocess.run(SHARDFS + ["mount", "--layout", "flat", "--cache-dir", env["SHARDFS_CACHE_DIR"],
                                     "--shard-dir", f"s3://{BUCKET}/mosaic", str(point)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    want = dict(expected, **{k: k for k in _files()})
    sums = run(["sha256sum", *want], cwd=point, check=True).stdout.split("\n")
    got = {line.split()[1]: line.split()[0] for line in sums if line}
    assert got == want
    assert not any((point / k).exists() for k in deleted)


def test_winery_mosaic_s3_pool_filled_by_swh_packer(s3, postgres_server, tmp_path, mounter, monkeypatch):
    """A winery whose shards pool is swh's ``mosaic-s3`` type: swh's
    writer, packer (MOSAIC files, zstd, uploaded by its
    ``MosaicS3BackedPool``) and cleaners fill the bucket; shardfs, given
    swh's own settings file, serves every object of the images in S3,
    of a packed image and of the write shard, through a mount
    (sha256sum), the API and the objstorage; an object deleted by swh is
    gone from all three."""
    import yaml
    from winery_deploy import Deployment

    from shardfs.objstorage import ShardfsObjStorage
    from shardfs.winery import WineryStore

    cluster, endpoint, client, env, shard = s3
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(name, env[name])  # swh's boto3 client (in this process) and the mount's
    cache = tmp_path / "cache"
    monkeypatch.setenv("SHARDFS_CACHE_DIR", str(cache))
    client.create_bucket(Bucket="winery")
    winery = Deployment(postgres_server, tmp_path / "pools", shard_max_size=4096, pool_type="mosaic-s3",
                        pool_name="mosaics", compression_level=3, base_url="s3://winery/archive",
                        boto3_config={"endpoint_url": endpoint})
    try:
        contents = [(f"s3-pool-{i}-".encode() * 40)[:300] + str(i).encode() for i in range(90)]
        keys = winery.add_many(contents[:60])
        winery.release()
        winery.pack_full()
        winery.clean()
        keys += winery.add_many(contents[60:75])
        winery.release()
        winery.pack_full()  # packed: its image in S3 and its table
        keys += winery.add_many(contents[75:])  # in a write shard only
        data = dict(zip(keys, contents))
        states = {state for _, _, state, _ in winery.shards()}
        assert {"readonly", "packed", "writing"} <= states, states
        listed = client.list_objects_v2(Bucket="winery", Prefix="archive/mosaics/")["Contents"]
        images = {o["Key"].rsplit("/", 1)[1] for o in listed}
        assert images == {name for _, name, state, _ in winery.shards() if state in ("readonly", "packed")}
        for o in listed:
            assert client.get_object(Bucket="winery", Key=o["Key"], Range="bytes=0-3")["Body"].read() == \
                b"\x1a\x45\xdf\xa3"  # EBML: MOSAIC files
        gone = keys[5]
        winery.delete(gone)
        winery.clean_deleted()
        config = tmp_path / "winery.yml"
        config.write_text(yaml.safe_dump({"objstorage": {
            "cls": "winery", "database": {"db": winery.readonly_dsn},
            "shards_pools": [dict(winery.pool_settings)], "shards_active_pool": "mosaics"}}))
        point = mounter.mount([], tmp_path / "m", "--winery-config", str(config), "--cache-dir", str(cache))
        names = [key.hex() for key in keys if key != gone]
        out = run(["sha256sum", *names], cwd=point, check=True).stdout
        assert sum(line.split()[0] == line.split()[1] for line in out.splitlines()) == len(names)
        assert not (point / gone.hex()).exists()
        copies = [n for _, _, files in os.walk(cache / "s3") for n in files if n.endswith(".mosaic")]
        assert len(copies) == len(images), copies  # each image read from S3, through its local copy
        with WineryStore(winery.readonly_dsn, pools_dir=str(config), cache_dir=str(cache)) as store:
            assert store.get_batch(keys) == [None if k == gone else data[k] for k in keys]
        storage = ShardfsObjStorage(winery={"config": str(config)}, cache_dir=str(cache))
        assert all(storage.get({"sha256": k}) == data[k] for k in keys if k != gone)
        with pytest.raises(Exception, match="not found|ObjNotFound|absent"):
            storage.get({"sha256": gone})
    finally:
        winery.close()
        winery.drop()
