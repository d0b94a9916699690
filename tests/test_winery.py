"""shardfs over a real winery object storage (swh-objstorage 7.4.1): the
Python API (`shardfs.winery.WineryStore`) and `shardfs mount --winery`.

Every deployment is made by swh-objstorage's own code on a real PostgreSQL
(tests/winery_deploy.py): objects added with its writer, shards packed,
cleaned, objects deleted and purged by its housekeeping. shardfs reads it
as the read-only ``guest`` role (SELECT rights only).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from mounting import SHARDFS, mount_processes, needs_fuse, run, wait_until

pytestmark = pytest.mark.winery(shard_max_size=4096)

#: The bound the README promises for new objects, shards and takedowns.
LIVE_BOUND = 5.0


def blobs(tag: str, count: int, size: int = 300) -> list:
    """`count` distinct contents of about `size` bytes."""
    return [(f"{tag}-{i}-".encode() * (size // 8 + 1))[:size] + str(i).encode() for i in range(count)]


def build(winery, readonly: int = 20, packed: int = 20, written: int = 10):
    """A deployment with objects in readonly shards (images only), packed
    shards (image and table) and write shards (table only). Returns
    (contents by key, keys by where)."""
    where = {}
    data = {}
    for name, count in (("readonly", readonly), ("packed", packed)):
        keys = winery.add_many(blobs(name, count))
        winery.release()
        assert winery.pack_full()
        if name == "readonly":
            assert winery.clean()
        where[name] = keys
    where["written"] = winery.add_many(blobs("written", written, 200))
    for name, keys in where.items():
        for key, content in zip(keys, blobs(name, len(keys), 300 if name != "written" else 200)):
            data[key] = content
    states = {state for _, _, state, _ in winery.shards()}
    assert {"readonly", "packed"} <= states, states
    return data, where


def store_of(winery):
    from shardfs.winery import WineryStore

    return WineryStore(winery.readonly_dsn, pools_dir=winery.pools_dir)


# ------------------------------------------------------------------ API


def test_api_reads_images_and_write_shards(winery):
    data, where = build(winery)
    with store_of(winery) as store:
        assert store.schema == 5
        for key, content in data.items():
            assert store.get(key) == content
            assert store.get(key.hex()) == content
            assert key in store
        absent = hashlib.sha256(b"never added").digest()
        assert absent not in store
        with pytest.raises(KeyError):
            store.get(absent)
        keys = list(data)[::3] + [absent]
        assert store.get_batch(keys) == [data.get(k) for k in keys]
        with pytest.raises(ValueError):
            store.get("not a key")


def test_api_image_hits_make_no_query_and_absent_keys_one(winery):
    data, where = build(winery)
    with store_of(winery) as store:
        reader, db = store.reader, store.db
        before = db.queries
        for key in where["readonly"] + where["packed"]:
            assert reader.get(key) == data[key]
        assert db.queries == before, "an object in an image cost a database query"
        reader.get(hashlib.sha256(b"absent").digest())
        assert db.queries == before + 1, "an absent key cost more than one query"
        before = db.queries
        assert reader.get(where["written"][0]) == data[where["written"][0]]
        assert db.queries - before == 1, "an object in a write shard cost more than one query"
        before = db.queries
        loc = reader.locate(where["written"][1])
        assert loc is not None and loc.size == len(data[where["written"][1]])
        assert db.queries - before == 1, "locating an object in a write shard cost more than one query"


def test_api_reads_on_after_a_postgresql_restart(winery, postgres_server):
    """Pooled sessions are not tested before each query (a round trip
    each): after the server restarts, the first query on a stale session
    fails and the next sessions are tried, so the reader sees no error."""
    data, where = build(winery, readonly=2, packed=2, written=6)
    with store_of(winery) as store:
        keys = where["written"]
        threads = [threading.Thread(target=lambda k=k: store.get(k)) for k in keys[:2]]
        for t in threads:  # two sessions in the pool
            t.start()
        for t in threads:
            t.join()
        postgres_server.stop()
        postgres_server.start()
        for key in keys:
            assert store.get(key) == data[key]


def test_api_hides_deleted_keys_everywhere(winery):
    data, where = build(winery)
    gone = [where["readonly"][0], where["packed"][1], where["written"][2]]
    for key in gone:
        winery.delete(key)
    with store_of(winery) as store:
        for key in gone:
            assert key not in store
            with pytest.raises(KeyError):
                store.get(key)
        assert store.get_batch(gone) == [None, None, None]
        # The bytes of the first are still in its image until swh's cleaner
        # runs: shardfs must not serve them.
        from shardfs import Shard

        name = winery.signature(gone[0])[0]
        with Shard(winery.image_path(name)) as shard:
            assert shard.get(gone[0]) == data[gone[0]]
    # swh's cleaner needs every shard holding a deleted key to have an image.
    winery.release()
    winery.pack_full()
    winery.clean()
    assert winery.clean_deleted() == 3  # zeroes them in the images, removes the rows
    with store_of(winery) as store:
        for key in gone:
            assert key not in store
        for key in where["readonly"][1:] + where["packed"][2:] + where["written"][3:]:
            assert store.get(key) == data[key]


def test_api_hides_keys_purged_from_the_database_but_left_in_an_image(winery):
    """swh's cleaner removes the row of an object deleted while its shard
    is packed without erasing it from the image: a reader that starts
    afterwards (no 'deleted' row to see) must still not serve it."""
    data, where = build(winery, readonly=5, packed=10, written=0)
    victim = where["packed"][3]
    winery.delete(victim)
    assert winery.clean_deleted() == 1
    assert winery.signature(victim) is None
    from shardfs import Shard

    with Shard(winery.image_path(winery.shards()[-1][1])) as shard:
        assert shard.get(victim) == data[victim]  # the bytes are still there
    with store_of(winery) as store:
        assert victim not in store
        assert store.get_batch([victim]) == [None]
        for key in where["packed"]:
            if key != victim:
                assert store.get(key) == data[key]


def test_api_follows_a_shard_packed_and_cleaned_meanwhile(winery):
    from shardfs.winery import POLL_SECONDS

    keys = winery.add_many(blobs("moving", 15))
    with store_of(winery) as store:
        assert all(store.get(k) for k in keys)
        winery.release()
        winery.pack_full()
        winery.clean()
        time.sleep(POLL_SECONDS + 0.1)  # the next call polls the catalog again (no event to wait for)
        for k, content in zip(keys, blobs("moving", 15)):
            assert store.get(k) == content
        assert len(store.shards) >= 1


def test_api_refuses_a_wrong_dsn_and_a_database_that_is_not_winery(winery, postgres_server):
    from shardfs.winery import WineryError, WineryStore

    with pytest.raises(WineryError) as info:
        WineryStore(winery.readonly_dsn.replace("password=guest", "password=wrong"))
    assert "\n" not in str(info.value) and "wrong" not in str(info.value)
    with pytest.raises(WineryError, match="not a winery database"):
        WineryStore(postgres_server.dsn("postgres"))


# ---------------------------------------------------------------- mount


def mount_winery(mounter, winery, point: Path, *extra: str) -> Path:
    return mounter.mount([], point, "--winery", winery.readonly_dsn, "--winery-pools-dir",
                         winery.pools_dir, *extra)


def path_of(point: Path, key: bytes) -> Path:
    return point / key.hex()


@needs_fuse
def test_mount_serves_images_and_write_shards_and_hides_deleted(winery, mounter, tmp_path):
    data, where = build(winery)
    gone = [where["readonly"][3], where["written"][4]]
    for key in gone:
        winery.delete(key)
    point = mount_winery(mounter, winery, tmp_path / "m")
    for key, content in data.items():
        if key in gone:
            assert not path_of(point, key).exists()
            continue
        assert path_of(point, key).read_bytes() == content
        # Also where the fan-out layout lists it.
        name = key.hex()
        assert (point / name[:2] / name[2:4] / name).read_bytes() == content
    # sha256sum through the mount: every name is its content's hash.
    names = [key.hex() for key in data if key not in gone]
    out = run(["sha256sum", *names], cwd=point, check=True).stdout
    assert all(line.split()[0] == line.split()[1] for line in out.splitlines())
    # Listings show write shard objects and leave deleted ones out.
    listed = set()
    for dirpath, _, files in os.walk(point):
        listed.update(files)
    assert listed == set(names)


@needs_fuse
@pytest.mark.parametrize("level", [None, 3])
def test_mosaic_pool_is_served_by_the_api_and_the_mount(postgres_server, mounter, tmp_path, level):
    """A winery whose shards pool is swh's ``mosaic`` type (swh's packer
    writes every image as a MOSAIC file: raw, or zstd): the API and a
    mount serve every object of its images and write shards, sha256sum-clean;
    an object deleted by swh (its row, then swh's cleaner's
    ``MosaicUpdater.delete`` in the image) is gone from both."""
    from winery_deploy import Deployment

    winery = Deployment(postgres_server, tmp_path / "pools", shard_max_size=4096, pool_type="mosaic",
                        pool_name="mosaics", compression_level=level)
    try:
        data, where = build(winery)
        images = [p for p in (tmp_path / "pools" / "mosaics").iterdir()]
        assert images and all(p.read_bytes()[:4] == b"\x1a\x45\xdf\xa3" for p in images)  # EBML: MOSAIC files
        gone = where["readonly"][3]
        winery.delete(gone)
        assert winery.clean_deleted() == 1  # swh's MosaicUpdater.delete on the image
        with store_of(winery) as store:
            assert store.get_batch(list(data)) == [None if key == gone else data[key] for key in data]
            assert gone not in store
        point = mount_winery(mounter, winery, tmp_path / "m")
        names = [key.hex() for key in data if key != gone]
        out = run(["sha256sum", *names], cwd=point, check=True).stdout
        assert sum(line.split()[0] == line.split()[1] for line in out.splitlines()) == len(names)
        assert not path_of(point, gone).exists()
    finally:
        winery.close()
        winery.drop()


@needs_fuse
def test_mount_takes_swh_winery_settings(postgres_server, mounter, tmp_path):
    """``--winery-config FILE``: the deployment's own settings, as swh
    writes them (``objstorage: {cls: winery, database: {db: DSN},
    shards_pools: [...], shards_active_pool}``): the database and where
    each pool keeps its images come from there (here a ``mosaic`` pool
    whose base directory no other option names); every object served."""
    import yaml
    from winery_deploy import Deployment

    winery = Deployment(postgres_server, tmp_path / "elsewhere", shard_max_size=4096, pool_type="mosaic",
                        pool_name="mosaics", compression_level=3)
    try:
        data, _ = build(winery)
        config = tmp_path / "winery.yml"
        config.write_text(yaml.safe_dump({"objstorage": {
            "cls": "winery", "database": {"db": winery.readonly_dsn},
            "shards_pools": [dict(winery.pool_settings)], "shards_active_pool": "mosaics"}}))
        from shardfs.objstorage import ShardfsObjStorage

        storage = ShardfsObjStorage(winery={"config": str(config)}, cache_dir=str(tmp_path / "cache"))
        assert all(storage.get({"sha256": key}) == content for key, content in data.items())
        point = mounter.mount([], tmp_path / "m", "--winery-config", str(config))
        names = [key.hex() for key in data]
        out = run(["sha256sum", *names], cwd=point, check=True).stdout
        assert sum(line.split()[0] == line.split()[1] for line in out.splitlines()) == len(names)
        proc = run(SHARDFS + ["mount", "--winery-config", str(config), "--winery", winery.readonly_dsn,
                              str(tmp_path / "m2")])
        assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1
    finally:
        winery.close()
        winery.drop()


@needs_fuse
def test_mount_is_live_new_objects_shards_and_takedowns(winery, mounter, tmp_path):
    data, where = build(winery, readonly=10, packed=10, written=5)
    point = mount_winery(mounter, winery, tmp_path / "m")
    # A new object (in a write shard) shows within the bound, even after a
    # lookup of its name failed (no negative entry cached longer).
    content = b"a new object"
    key = hashlib.sha256(content).digest()
    assert not path_of(point, key).exists()
    winery.add(content)
    t0 = time.monotonic()
    assert wait_until(lambda: path_of(point, key).exists(), timeout=LIVE_BOUND)
    assert path_of(point, key).read_bytes() == content
    # Takedowns: of an object in a readonly image, read (and cached by the
    # kernel) just before, and of one in a write shard.
    victims = [where["readonly"][0], where["packed"][0], key]
    for v in victims:
        assert path_of(point, v).read_bytes()
    for v in victims:
        winery.delete(v)
    t0 = time.monotonic()
    assert wait_until(lambda: not any(path_of(point, v).exists() for v in victims), timeout=LIVE_BOUND), \
        "a taken-down object is still visible after the live bound"
    took = time.monotonic() - t0
    for v in victims:
        with pytest.raises(FileNotFoundError):
            path_of(point, v).read_bytes()
    # A new read shard: the write shard packed and cleaned under the mount.
    winery.release()
    winery.pack_full()
    winery.clean()
    for k in where["written"]:
        assert path_of(point, k).read_bytes() == data[k]
    print(f"takedown seen after {took:.2f} s")


@needs_fuse
def test_mount_finds_images_and_write_shards_by_sha1_and_sha1_git(winery, mounter, tmp_path):
    """-o hashes=sha1:sha1_git on a winery mount: the objects of images
    (indexed by the mount's builder) and of write shard tables (hashed by
    the worker from PostgreSQL) are found by sha1/<hex>, sha1_git/<hex> and
    swh:1:cnt:<hex> with their bytes, digests as swh.model computes them;
    an object written under the mount is found within the live bound; a
    taken-down one is not."""
    from swh.model.hashutil import MultiHash

    data, where = build(winery, readonly=10, packed=10, written=10)
    point = mount_winery(mounter, winery, tmp_path / "m", "-o", "hashes=sha1:sha1_git")
    stats = lambda: json.loads(os.getxattr(point, "user.shardfs.stats"))["hashes"]  # noqa: E731
    assert wait_until(lambda: stats()["pending"] == 0, timeout=60), stats()

    def names(content: bytes) -> list:
        d = MultiHash.from_data(content).digest()
        return [f"sha1/{d['sha1'].hex()}", f"sha1_git/{d['sha1_git'].hex()}", f"swh:1:cnt:{d['sha1_git'].hex()}"]

    for key, content in data.items():
        for name in names(content):
            assert (point / name).read_bytes() == content, (name, key in where["written"])
    content = b"written under a mount that finds it by sha1_git"
    assert not (point / names(content)[1]).exists()
    winery.add(content)
    assert wait_until(lambda: (point / names(content)[2]).exists(), timeout=LIVE_BOUND)
    assert (point / names(content)[2]).read_bytes() == content
    victim = where["written"][0]
    winery.delete(victim)
    assert wait_until(lambda: not (point / names(data[victim])[0]).exists(), timeout=LIVE_BOUND)


@needs_fuse
def test_mount_readers_while_shards_are_packed(winery, mounter, tmp_path):
    keys = winery.add_many(blobs("busy", 40))
    contents = dict(zip(keys, blobs("busy", 40)))
    point = mount_winery(mounter, winery, tmp_path / "m", "-o", "workers=2")
    errors, stop = [], threading.Event()

    def reader(i: int) -> None:
        n = 0
        while not stop.is_set():
            k = keys[(i * 7 + n) % len(keys)]
            n += 1
            try:
                got = path_of(point, k).read_bytes()
                if got != contents[k]:
                    errors.append(f"{k.hex()}: wrong bytes")
            except OSError as exc:
                errors.append(f"{k.hex()}: {exc}")

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        winery.release()
        winery.pack_full()
        time.sleep(1.5)
        winery.clean()
        time.sleep(1.5)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert errors == []
    # Every image packed under the mount is served now (there was none),
    # once the mount has polled the catalog again.
    images = sum(1 for _, _, state, _ in winery.shards() if state in ("packed", "cleaning", "readonly"))
    assert images >= 1
    served = lambda: json.loads(os.getxattr(point, "user.shardfs.stats"))["shards"]  # noqa: E731
    assert wait_until(lambda: served() == images, timeout=10), (served(), images)


@needs_fuse
def test_mount_survives_postgresql_restart(winery, mounter, tmp_path, postgres_server):
    data, where = build(winery, readonly=10, packed=5, written=5)
    point = mount_winery(mounter, winery, tmp_path / "m")
    image_key, db_key = where["readonly"][0], where["written"][0]
    assert path_of(point, db_key).read_bytes() == data[db_key]
    postgres_server.stop()
    try:
        # Images keep being served, by name already known or not.
        for k in where["readonly"] + where["packed"]:
            assert path_of(point, k).read_bytes() == data[k]
        # An object only in the database: EIO within the documented bound.
        t0 = time.monotonic()
        with pytest.raises(OSError) as info:
            path_of(point, where["written"][1]).read_bytes()
        assert info.value.errno == errno.EIO
        took = time.monotonic() - t0
        assert took < 10.0
        print(f"EIO after {took:.2f} s with PostgreSQL stopped")
    finally:
        postgres_server.start()
    # Reconnected by itself.
    assert wait_until(lambda: _readable(path_of(point, where["written"][1])), timeout=15)
    assert path_of(point, image_key).read_bytes() == data[image_key]


def _readable(path: Path) -> bool:
    try:
        path.read_bytes()
        return True
    except OSError:
        return False


@needs_fuse
def test_mount_keeps_the_password_out_of_ps_mounts_and_logs(winery, mounter, tmp_path):
    log = tmp_path / "fuse.log"
    build(winery, readonly=5, packed=5, written=3)
    point = mount_winery(mounter, winery, tmp_path / "m", "--log-file", str(log), "--debug")
    os.listdir(point)
    secret = "password=guest"
    for pid in mount_processes(point):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"guest" not in f.read().replace(b"user=guest", b"")
        with open(f"/proc/{pid}/environ", "rb") as f:
            assert secret.encode() not in f.read()
    with open("/proc/mounts") as f:
        line = [l for l in f if str(point) in l][0]
    assert "guest" not in line and "winery" in line
    assert secret not in log.read_text()


@needs_fuse
def test_mount_connections_are_bounded_and_closed_at_unmount(winery, mounter, tmp_path):
    build(winery, readonly=5, packed=5, written=10)
    point = mount_winery(mounter, winery, tmp_path / "m", "-o", "workers=2")

    def connections() -> int:
        with winery.connect() as c:
            return c.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = 'guest' "
                             "AND datname = %s", (winery.dbname,)).fetchone()[0]

    for dirpath, _, files in os.walk(point):
        for f in files:
            Path(dirpath, f).read_bytes()
    n = connections()
    assert 1 <= n <= 1 + 2 * 2, n
    run(SHARDFS + ["umount", str(point)], check=True)
    assert wait_until(lambda: connections() == 0, timeout=10), connections()


def test_mount_refuses_a_wrong_dsn_in_one_line(winery, tmp_path):
    point = tmp_path / "m"
    point.mkdir()
    bad = winery.readonly_dsn.replace("password=guest", "password=nope")
    proc = run(SHARDFS + ["mount", "--winery", bad, str(point)])
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "nope" not in proc.stderr
    proc = run(SHARDFS + ["mount", "--winery", winery.server.dsn("postgres"), str(point)])
    assert proc.returncode != 0 and "not a winery database" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@needs_fuse
def test_fstab_form_with_a_uri_and_a_password_file(winery, shardfs_helper_in_path, mounter, tmp_path,
                                                     postgres_server):
    """The fstab line of the README: `mount -t fuse.shardfs postgresql://...
    MP -o winery_pools_dir=...`, the password in a libpq password file."""
    data, where = build(winery, readonly=5, packed=5, written=3)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{postgres_server.port}:*:guest:guest\n")
    passfile.chmod(0o600)
    uri = f"postgresql://guest@127.0.0.1:{postgres_server.port}/{winery.dbname}"
    point = tmp_path / "m"
    env = dict(os.environ, PGPASSFILE=str(passfile))
    proc = mounter.command(["mount", "-t", "fuse.shardfs", "-o", f"ro,winery_pools_dir={winery.pools_dir}",
                            uri, str(point)], point, env=env)
    assert proc.returncode == 0, proc.stderr
    for key in where["readonly"] + where["written"]:
        assert path_of(point, key).read_bytes() == data[key]
    assert run(["umount", str(point)]).returncode == 0


def test_inode_rings_resolve_across_positions_and_go_stale_when_overwritten():
    """The shared rings that name database objects: any process resolves
    an entry; an entry overwritten RING_ENTRIES numbers later resolves to
    nothing (ESTALE for the kernel); ring_find lists every live entry of a
    key (what a takedown invalidates)."""
    from shardfs.fuse.layout import db_inode, split_db_inode, split_object_inode
    from shardfs.fuse.shared import RING_ENTRIES, SharedState

    state = SharedState(3)
    try:
        a, b = hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest()
        na = state.ring_put(0, a, 10)
        nb = state.ring_put(2, b, 20)
        na2 = state.ring_put(2, a, 10)
        assert state.ring_get(0, na) == (a, 10) and state.ring_get(2, nb) == (b, 20)
        assert state.ring_get(1, na) is None and state.ring_get(2, 12345) is None
        assert sorted(state.ring_find(a)) == [(0, na), (2, na2)]
        inode = db_inode(2, nb)
        assert split_db_inode(inode) == (2, nb) and split_object_inode(inode) is None
        for i in range(RING_ENTRIES):
            state.ring_put(2, a, i)
        assert state.ring_get(2, nb) is None
        assert state.ring_find(b) == []
        assert state.ring_get(0, na) == (a, 10)
    finally:
        state.close()


def _two_pool_settings(winery, pools_dir: Path, dsn: str) -> dict:
    """swh's winery settings for `winery` with its directory pool
    ``shards`` (active) and a ``mosaics`` pool (MOSAIC files, zstd) beside
    it, in `pools_dir`."""
    directory = dict(winery.pool_settings)
    mosaics = {"type": "mosaic", "pool_name": "mosaics", "base_directory": str(pools_dir),
               "shard_max_size": winery.shard_max_size, "compression_level": 3}
    return {"objstorage": {"cls": "winery", "database": {"db": dsn},
                           "shards_pools": [directory, mosaics], "shards_active_pool": "shards"}}


@needs_fuse
def test_images_moved_by_migrate_pool_stay_served_once(postgres_server, mounter, tmp_path):
    """swh's own ``swh objstorage winery migrate-pool shards mosaics`` under
    a mount and the API (Read Shard images of a ``directory`` pool copied
    into MOSAIC files of a ``mosaic`` pool, then each image's row moved):
    while it runs, every listing of the mount (fan-out layout) shows every
    name exactly once and every object reads right; within the live bound
    each image is served from its new pool; once the old images are
    deleted and the page cache dropped, every object still reads, through
    the mount and the API."""
    import collections

    import yaml
    from winery_deploy import Deployment

    from shardfs.winery import WineryStore

    pools = tmp_path / "pools"
    winery = Deployment(postgres_server, pools, shard_max_size=4096)
    try:
        contents = blobs("moved", 240)
        keys = winery.add_many(contents)
        winery.release()
        winery.pack_full()
        winery.clean()
        data = dict(zip(keys, contents))
        images = sorted(p.name for p in (pools / "shards").iterdir())
        assert len(images) >= 10 and {s for _, _, s, _ in winery.shards()} == {"readonly"}
        writer_config = tmp_path / "winery-rw.yml"
        writer_config.write_text(yaml.safe_dump(_two_pool_settings(winery, pools, winery.dsn)))
        config = tmp_path / "winery.yml"
        config.write_text(yaml.safe_dump(_two_pool_settings(winery, pools, winery.readonly_dsn)))
        point = mounter.mount([], tmp_path / "m", "--winery-config", str(config))
        names = sorted(key.hex() for key in keys)

        def fanout(name: str) -> Path:
            return point / name[:2] / name[2:4] / name

        faults: list = []
        listings = [0]
        stop = threading.Event()

        def watch() -> None:
            i = 0
            while not stop.is_set():
                listed = [f for _, _, files in os.walk(point) for f in files]
                doubled = [n for n, c in collections.Counter(listed).items() if c > 1]
                if doubled or sorted(set(listed)) != names:
                    faults.append(f"listing: {len(set(names) - set(listed))} missing, {doubled[:3]} doubled")
                listings[0] += 1
                for key in keys[i % 7::7]:
                    try:
                        if fanout(key.hex()).read_bytes() != data[key]:
                            faults.append(f"{key.hex()}: wrong bytes")
                    except OSError as exc:
                        faults.append(f"{key.hex()}: {exc}")
                i += 1

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            time.sleep(0.5)
            proc = run([str(Path(SHARDFS[0]).parent / "swh"), "objstorage", "winery", "migrate-pool",
                        "--no-progress", "shards", "mosaics"], timeout=300,
                       env=dict(os.environ, SWH_CONFIG_FILENAME=str(writer_config)))
            assert proc.returncode == 0, proc.stderr
            moved = time.monotonic()
            moved_images = sorted(p.name for p in (pools / "mosaics").iterdir())
            assert moved_images == images
            assert all((pools / "mosaics" / n).read_bytes()[:4] == b"\x1a\x45\xdf\xa3" for n in images)
            assert {p for _, _, _, p in winery.shards()} == {"mosaics"}
            new_home = os.fsencode(str(pools / "mosaics"))

            def all_moved() -> bool:
                return all(os.getxattr(fanout(n), "user.shardfs.shard").startswith(new_home) for n in names)

            assert wait_until(all_moved, timeout=LIVE_BOUND + 2, interval=0.2), \
                "an image is still served from its old pool after the live bound"
            print(f"every image served from its new pool {time.monotonic() - moved:.2f} s after the move")
            time.sleep(1.0)
        finally:
            stop.set()
            watcher.join()
        assert not faults, faults[:5]
        assert listings[0] >= 3
        for name in images:
            (pools / "shards" / name).unlink()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        out = run(["sha256sum", *(str(fanout(n).relative_to(point)) for n in names)], cwd=point, check=True).stdout
        assert sum(line.split()[0] == Path(line.split()[1]).name for line in out.splitlines()) == len(names)
        with WineryStore(winery.readonly_dsn, pools_dir=str(config)) as store:
            assert store.get_batch(keys) == contents
    finally:
        winery.close()
        winery.drop()
