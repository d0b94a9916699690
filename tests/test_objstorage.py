"""shardfs as a Software Heritage objstorage (`cls: shardfs`,
shardfs/objstorage.py), tested with swh-objstorage's own code: its factory,
its RPC server (`swh objstorage rpc-serve`) read by its `remote` client, its
`multiplexer`, the read-only tests of its `ObjStorageTestFixture`, and a
real winery deployment (tests/winery_deploy.py). Object ids are made by
swh's hashing (`objid_for_content`: sha1, sha1_git, sha256, blake2s256).
"""
import concurrent.futures
import os
import subprocess
import sys
import time

import pytest
from swh.core.api import RemoteException
from swh.objstorage.exc import ObjCorruptedError, ObjNotFoundError, ReadOnlyObjStorageError
from swh.objstorage.factory import get_objstorage
from swh.objstorage.objstorage import objid_for_content
from swh.objstorage.tests.objstorage_testing import ObjStorageTestFixture
from swh_rpc import objstorage_server

import shardfs
from shardfs import hashes, sidecar
from shardfs.objstorage import ConfigError

def contents(tag: str, count: int) -> list:
    return [f"{tag} object {i} ".encode() * (i % 7 + 1) for i in range(count)]


def write_shard(path, datas) -> list:
    """A shard of `datas` at `path`; their swh ids, in order."""
    ids = [objid_for_content(d) for d in datas]
    with shardfs.ShardWriter(str(path)) as w:
        for obj_id, data in zip(ids, datas):
            w.add(obj_id["sha256"], data)
    return ids


@pytest.fixture
def two_shards(tmp_path):
    """Two shards in tmp_path/shards: (paths, {id as tuple: bytes}, ids)."""
    (tmp_path / "shards").mkdir()
    paths, data, ids = [], {}, []
    for n in range(2):
        datas = contents(f"shard{n}", 40)
        path = tmp_path / "shards" / f"{n}.shard"
        got = write_shard(path, datas)
        paths.append(str(path))
        ids += got
        data.update({tuple(sorted(i.items())): d for i, d in zip(got, datas)})
    return paths, data, ids


def content_of(data, obj_id):
    return data[tuple(sorted(obj_id.items()))]


def test_factory_reads_with_swh_semantics(two_shards, tmp_path):
    paths, data, ids = two_shards
    storage = get_objstorage("shardfs", shards=paths, cache_dir=str(tmp_path / "cache"))
    assert storage.name == "shardfs" and storage.primary_hash == "sha256"
    for obj_id in ids:
        assert storage.get(obj_id) == content_of(data, obj_id)
        assert obj_id in storage
        assert {"sha256": obj_id["sha256"]} in storage
        storage.check(obj_id)  # every hash the id carries re-computed
    missing = objid_for_content(b"never stored")
    assert missing not in storage
    with pytest.raises(ObjNotFoundError) as exc:
        storage.get(missing)
    assert missing in exc.value.args
    with pytest.raises(ObjNotFoundError):
        storage.check(missing)
    with pytest.raises(ObjNotFoundError):
        storage.get({"sha1": ids[0]["sha1"]})  # no sha256: cannot be found
    wanted = [ids[3], missing, ids[50], ids[0]]
    assert list(storage.get_batch(wanted)) == [content_of(data, ids[3]), None,
                                               content_of(data, ids[50]), content_of(data, ids[0])]
    # An id whose sha1 does not match the bytes its sha256 names is corrupt.
    bad = dict(ids[1], sha1=ids[2]["sha1"])
    with pytest.raises(ObjCorruptedError):
        storage.check(bad)
    for call in (lambda: storage.add(b"x", missing), lambda: storage.restore(b"x", missing),
                 lambda: storage.delete(ids[0])):
        with pytest.raises(ReadOnlyObjStorageError):
            call()
    assert storage.check_config(check_write=False) is True
    assert storage.check_config(check_write=True) is False
    assert storage.download_url(ids[0]) is None
    storage.close()


@pytest.mark.parametrize("config, message", [
    ({}, "give 'shards', 'shard_dir'"),
    ({"shards": "/one/path.shard"}, "must be a list"),
    ({"shards": ["/x"], "winery": {"dsn": "dbname=x"}}, "stands alone"),
    ({"winery": {"pools_dir": "/p"}}, "needs 'dsn'"),
    ({"winery": {"dsn": "dbname=x", "pool": "/p"}}, "unknown: pool"),
    ({"shards": ["/x"], "primary_hash": "md5"}, "primary_hash 'md5' is not supported"),
    ({"shards": ["/x"], "primary_hash": "sha1", "hashes": ["sha1_git"]}, "needs sha1 in 'hashes'"),
    ({"shards": ["/x"], "hashes": "sha1"}, "'hashes' must be a list"),
    ({"winery": {"dsn": "dbname=x"}, "primary_hash": "sha1_git"}, "sha256 only"),
])
def test_a_wrong_config_is_one_clear_error(config, message):
    with pytest.raises(ConfigError, match=message) as exc:
        get_objstorage("shardfs", **config)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("primary", ["sha1", "sha1_git"])
def test_primary_hash_sha1_or_sha1_git(two_shards, tmp_path, primary):
    """primary_hash sha1 or sha1_git: the shards' indexes are built at
    construction (into the cache directory, used again by the next
    storage); ids carrying only that hash (as swh's tools make them) are
    found by get, get_batch, in and check; through swh's own RPC server
    and remote client too; an id of a digest no object has is
    ObjNotFoundError, and an id whose digest belongs to another hash is
    not found."""
    paths, data, ids = two_shards
    cache = str(tmp_path / "cache")
    config = {"cls": "shardfs", "shards": paths, "cache_dir": cache, "primary_hash": primary}
    storage = get_objstorage(**config)
    assert storage.primary_hash == primary
    for path in paths:
        with shardfs.Shard(path) as s:
            assert os.path.exists(hashes.index_path(cache, sidecar.identity(s), primary))
    only = [{primary: i[primary]} for i in ids]
    for obj_id, full in zip(only, ids):
        assert storage.get(obj_id) == content_of(data, full)
        assert obj_id in storage
        storage.check(obj_id)
    missing = {primary: objid_for_content(b"never stored")[primary]}
    other = "sha1" if primary == "sha1_git" else "sha1_git"
    assert missing not in storage and {primary: ids[0][other]} not in storage
    with pytest.raises(ObjNotFoundError):
        storage.get(missing)
    assert list(storage.get_batch([only[3], missing, ids[7], only[50]])) == [
        content_of(data, ids[3]), None, content_of(data, ids[7]), content_of(data, ids[50])]
    storage.close()
    again = get_objstorage(**config)  # the indexes are found, not built again
    assert again.get(only[1]) == content_of(data, ids[1])
    again.close()
    with objstorage_server(config, tmp_path, "rpc-serve") as remote:
        assert remote.get(only[5]) == content_of(data, ids[5])
        assert list(remote.get_batch([only[6], missing])) == [content_of(data, ids[6]), None]


def test_a_cache_dir_it_cannot_write_costs_a_private_one(two_shards, tmp_path):
    paths, data, ids = two_shards
    (tmp_path / "a file").write_bytes(b"")
    cache = str(tmp_path / "a file" / "cache")  # ENOTDIR, as EACCES for a read-only login
    storage = get_objstorage("shardfs", shards=paths, cache_dir=cache)
    assert [storage.get(i) for i in ids] == [content_of(data, i) for i in ids]
    built = storage._backend.sidecar_dir
    assert built != cache and os.path.isdir(built)
    storage.close()
    assert not os.path.exists(built)  # removed with the storage


def test_a_missing_shard_fails_construction(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.shard: No such file"):
        get_objstorage("shardfs", shards=[str(tmp_path / "absent.shard")], cache_dir=str(tmp_path))


def test_shard_dir_is_followed_and_takedowns_are_seen_at_once(two_shards, tmp_path):
    paths, data, ids = two_shards
    shard_dir = tmp_path / "shards"
    storage = get_objstorage("shardfs", shard_dir=str(shard_dir), cache_dir=str(tmp_path / "cache"))
    assert storage.get(ids[0]) == content_of(data, ids[0])
    # A takedown: visible to the very next call.
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "shardfs"), "delete", "--yes", paths[0],
                    ids[0]["sha256"].hex()], check=True, capture_output=True)
    assert ids[0] not in storage
    with pytest.raises(ObjNotFoundError):
        storage.get(ids[0])
    # A shard added to the directory, then one removed: within RESCAN_SECONDS.
    new = write_shard(tmp_path / "new.shard", [b"a new object"])[0]
    os.rename(tmp_path / "new.shard", shard_dir / "2.shard")
    os.unlink(paths[1])
    deadline = time.monotonic() + 5
    while (new not in storage or ids[45] in storage) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert storage.get(new) == b"a new object"
    assert ids[45] not in storage and list(storage.get_batch([ids[45], ids[5]])) == [None, content_of(data, ids[5])]
    storage.close()


def test_threads_share_one_storage(two_shards, tmp_path):
    """swh's RPC server runs a thread per request: 8 threads reading at
    once, one at a time and in batches, every byte right."""
    paths, data, ids = two_shards
    storage = get_objstorage("shardfs", shards=paths, cache_dir=str(tmp_path / "cache"))
    missing = objid_for_content(b"absent")

    def reader(n):
        for _ in range(20):
            order = ids[n:] + ids[:n]
            assert [storage.get(i) for i in order[:10]] == [content_of(data, i) for i in order[:10]]
            assert list(storage.get_batch(order[10:30] + [missing])) == \
                [content_of(data, i) for i in order[10:30]] + [None]
        return True

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(reader, range(8)))
    storage.close()


def test_reads_after_a_fork(two_shards, tmp_path):
    """gunicorn loads the app, then forks workers: a child reads with its
    own shards, the parent keeps reading."""
    paths, data, ids = two_shards
    storage = get_objstorage("shardfs", shards=paths, cache_dir=str(tmp_path / "cache"))
    assert storage.get(ids[1]) == content_of(data, ids[1])
    with storage._lock:  # as if another thread were in a call when the process forks
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if every read is right
            ok = all(storage.get(i) == content_of(data, i) for i in ids) and \
                list(storage.get_batch(ids[:5])) == [content_of(data, i) for i in ids[:5]]
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert storage.get(ids[2]) == content_of(data, ids[2])
    storage.close()


def test_swh_rpc_server_and_remote_client_and_multiplexer(two_shards, tmp_path):
    paths, data, ids = two_shards
    config = {"cls": "shardfs", "shards": paths, "cache_dir": str(tmp_path / "cache")}
    with objstorage_server(config, tmp_path, "rpc-serve") as remote:
        missing = objid_for_content(b"not there")
        assert remote.get(ids[7]) == content_of(data, ids[7])
        assert ids[7] in remote and missing not in remote
        with pytest.raises(ObjNotFoundError):
            remote.get(missing)
        assert list(remote.get_batch([ids[60], missing])) == [content_of(data, ids[60]), None]
        with pytest.raises(RemoteException, match="ReadOnlyObjStorageError"):  # swh's client does not map it
            remote.add(b"x", missing)
        # A multiplexer over the remote shardfs storage and an empty one.
        memory = {"cls": "memory"}
        multi = get_objstorage("multiplexer", objstorages=[{"cls": "remote", "url": remote.url}, memory])
        assert multi.get(ids[9]) == content_of(data, ids[9])
        assert ids[9] in multi and missing not in multi
        with pytest.raises(ObjNotFoundError):
            multi.get(missing)


def test_swh_multiplexer_over_a_shardfs_storage(two_shards, tmp_path):
    paths, data, ids = two_shards
    multi = get_objstorage("multiplexer", objstorages=[
        {"cls": "shardfs", "shards": paths, "cache_dir": str(tmp_path / "cache")}, {"cls": "memory"}])
    assert [multi.get(i) for i in ids[:10]] == [content_of(data, i) for i in ids[:10]]
    assert list(multi.get_batch([ids[0], objid_for_content(b"nope")])) == [content_of(data, ids[0]), None]


class TestSwhFixtureReadOnly(ObjStorageTestFixture):
    """swh-objstorage's own backend tests that a read-only backend can pass
    (run from its module); those that add objects first are left out."""

    @pytest.fixture
    def swh_objstorage(self, tmp_path):
        path = tmp_path / "fixture.shard"
        write_shard(path, [b"an object swh's tests never ask for"])
        return get_objstorage("shardfs", shards=[str(path)], cache_dir=str(tmp_path / "cache"))

    # They add objects (read-only: ReadOnlyObjStorageError), or expect writes allowed.
    test_check_config = test_primary_hash = test_contains = test_add_get_w_id = None
    test_add_twice = test_add_big = test_add_statsd = test_add_get_batch = test_get_statsd = None
    test_restore_content = test_check_present = test_delete_missing = test_delete_present = None
    test_delete_readd = test_delete_not_allowed = test_delete_not_allowed_by_default = None
    test_add_batch = test_download_url = None


def test_winery_deployment(winery, tmp_path):
    from test_winery import build

    data, where = build(winery)
    storage = get_objstorage("shardfs", winery={"dsn": winery.readonly_dsn, "pools_dir": str(winery.pools_dir)},
                             cache_dir=str(tmp_path / "cache"))
    ids = {key: objid_for_content(content) for key, content in data.items()}
    for key, content in data.items():  # images (readonly, packed) and write shards
        assert storage.get(ids[key]) == content
        assert ids[key] in storage
        storage.check(ids[key])
    keys = list(data)
    assert list(storage.get_batch([ids[k] for k in keys])) == [data[k] for k in keys]
    gone = where["written"][0]
    winery.delete(gone)
    deadline = time.monotonic() + 10
    while ids[gone] in storage and time.monotonic() < deadline:
        time.sleep(0.2)
    with pytest.raises(ObjNotFoundError):
        storage.get(ids[gone])
    storage.close()


def test_winery_without_psycopg_is_one_line_naming_the_extra(tmp_path):
    """`pip install shardfs` alone: --winery and WineryStore say what to
    install, in one line, with no traceback."""
    block = "import sys; sys.modules['psycopg'] = None; "
    cli = subprocess.run([sys.executable, "-c", block + "from shardfs.cli import main; sys.exit(main())",
                          "mount", "--winery", "dbname=x", str(tmp_path)], capture_output=True, text=True)
    assert cli.returncode == 1
    assert cli.stderr.strip().splitlines() == [
        "shardfs: reading a winery database needs the Python module psycopg, which is not installed: "
        "pip install 'shardfs[winery]'"]
    api = subprocess.run([sys.executable, "-c", block + "from shardfs.winery import WineryStore\n"
                          "try:\n    WineryStore('dbname=x')\nexcept ImportError as e:\n    print(type(e).__name__, e)"],
                         capture_output=True, text=True)
    assert api.stdout.startswith("MissingDependencyError reading a winery database needs the Python module psycopg")


def test_nothing_outside_the_fuse_package_imports_from_it():
    """The library (ShardSet included) stands without the mount; only the
    command line imports the mount."""
    root = os.path.join(os.path.dirname(shardfs.__file__))
    for name in os.listdir(root):
        if name.endswith(".py") and name != "cli.py":
            with open(os.path.join(root, name)) as f:
                assert "shardfs.fuse" not in "".join(line for line in f if "import" in line), name


def test_gunicorn_workers_forked_after_loading_the_app(two_shards, tmp_path):
    """swh's WSGI app under gunicorn with --preload (the app, its config
    and the shardfs storage made once, then 2 workers forked): every
    object read right through both."""
    paths, data, ids = two_shards
    config = {"cls": "shardfs", "shards": paths, "cache_dir": str(tmp_path / "cache")}
    with objstorage_server(config, tmp_path, "gunicorn") as remote:
        for _ in range(3):  # requests land on both workers
            assert [remote.get(i) for i in ids] == [content_of(data, i) for i in ids]
