"""The winery test fixtures (tests/winery_deploy.py, tests/pg_server.py) give
what they claim: a real swh-objstorage winery deployment on a real PostgreSQL
server, whose write shards, Read Shard images, deletions, read-only role and
server restarts behave as the shardfs winery reader's tests will expect."""

import os
import stat

import psycopg
import pytest
from swh.objstorage.exc import ObjNotFoundError
from swh.shard import Shard


def contents(n, size=300, tag=b""):
    """`n` distinct contents of `size` bytes."""
    return [(tag + b"object %d " % i).ljust(size, b"#") for i in range(n)]


def shard_table_rows(deployment, name):
    """{key: content} of the write shard table of `name`."""
    with deployment.connect() as c:
        return dict(c.execute(f"SELECT key, content FROM shard_{name}").fetchall())


@pytest.mark.winery(shard_max_size=1000)
def test_objects_land_in_write_shards(winery):
    data = contents(10)  # 300 bytes each: 4 per shard fill it (1200 >= 1000)
    keys = winery.add_many(data)
    assert all(len(k) == 32 for k in keys)
    shards = winery.shards()
    assert [s[2] for s in shards] == ["full", "full", "writing"]
    assert all(s[3] == winery.pool_name for s in shards)
    assert winery.shard_tables() == sorted(s[1] for s in shards)
    for key, content in zip(keys, data):
        name, state = winery.signature(key)
        assert state == "present"
        assert shard_table_rows(winery, name)[key] == content
        assert winery.storage.get({"sha256": key}) == content
    assert not os.listdir(os.path.join(winery.pools_dir, winery.pool_name))
    # adding again is a no-op
    assert winery.add(data[0]) == keys[0]
    assert len(winery.shards()) == 3


@pytest.mark.winery(shard_max_size=1000)
def test_release_pack_clean(winery):
    data = contents(6)
    keys = winery.add_many(data)
    assert [s[2] for s in winery.shards()] == ["full", "writing"]
    writing = winery.shards()[1][1]
    assert winery.release() == writing
    assert winery.release() is None
    assert [s[2] for s in winery.shards()] == ["full", "full"]

    packed = winery.pack_full()
    assert packed == sorted(s[1] for s in winery.shards())
    assert [s[2] for s in winery.shards()] == ["packed", "packed"]
    assert winery.shard_tables() == packed  # write tables still there
    by_shard = {}
    for key, content in zip(keys, data):
        by_shard.setdefault(winery.signature(key)[0], {})[key] = content
    for name in packed:
        path = winery.image_path(name)
        assert path == os.path.join(winery.pools_dir, winery.pool_name, name)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o400  # swh "maps" it read-only
        with Shard(path) as image:
            assert image.header.objects_count == len(by_shard[name])
            for key, content in by_shard[name].items():
                assert image.lookup(key) == content
    assert winery.pack_full() == []

    assert winery.clean() == packed
    assert [s[2] for s in winery.shards()] == ["readonly", "readonly"]
    assert winery.shard_tables() == []
    for key, content in zip(keys, data):
        assert winery.storage.get({"sha256": key}) == content  # from the image now
    assert winery.clean() == []

    # the writer goes on with a new shard
    new = winery.add(b"after packing")
    assert winery.signature(new)[0] not in packed
    assert [s[2] for s in winery.shards()] == ["readonly", "readonly", "writing"]


@pytest.mark.winery(shard_max_size=1000)
def test_delete_and_clean_deleted(winery):
    data = contents(4)
    keys = winery.add_many(data)
    name = winery.signature(keys[0])[0]
    assert winery.pack_full() == [name] and winery.clean() == [name]
    rw_key, rw_other = winery.add_many([b"in a write shard", b"stays"])

    winery.delete(keys[0])
    assert winery.signature(keys[0]) == (name, "deleted")
    with pytest.raises(ObjNotFoundError):
        winery.storage.get({"sha256": keys[0]})
    with Shard(winery.image_path(name)) as image:  # still in the image
        assert image.lookup(keys[0]) == data[0]

    # in a write shard, swh deletes the table row at once
    rw_name = winery.signature(rw_key)[0]
    winery.delete(rw_key)
    assert winery.signature(rw_key) == (rw_name, "deleted")
    assert list(shard_table_rows(winery, rw_name)) == [rw_other]
    with pytest.raises(ObjNotFoundError):
        winery.delete(b"\0" * 32)

    # swh's cleaner chmods the image of every shard with a deleted object: pack first
    assert winery.release() == rw_name
    assert winery.pack_full() == [rw_name] and winery.clean() == [rw_name]
    assert winery.clean_deleted() == 2
    assert winery.signature(keys[0]) is None
    assert winery.signature(rw_key) is None
    with Shard(winery.image_path(name)) as image:
        with pytest.raises(KeyError):
            image.lookup(keys[0])  # zeroed
        for key, content in zip(keys[1:], data[1:]):
            assert image.lookup(key) == content
    with Shard(winery.image_path(rw_name)) as image:
        assert image.header.objects_count == 1
        assert image.lookup(rw_other) == b"stays"
    assert stat.S_IMODE(os.stat(winery.image_path(name)).st_mode) == 0o400
    assert winery.clean_deleted() == 0


def test_swh_pitfalls(winery):
    """What swh's housekeeping cannot do, and how the helpers report it."""
    key = winery.add(b"alone")
    name = winery.signature(key)[0]
    winery.delete(key)
    # no image yet: swh's deleted-objects cleaner fails chmod-ing it
    with pytest.raises(FileNotFoundError):
        winery.clean_deleted()
    assert winery.signature(key) == (name, "deleted")
    # a full shard with no object left: swh.shard would spin forever packing it
    assert winery.release() == name
    with pytest.raises(ValueError, match="would hang"):
        winery.pack_full()
    assert winery.shard_state(name) == "full"


def test_deleted_while_packed_stays_in_image(winery):
    """swh's cleaner only zeroes objects of readonly (cleaned) shards, but it
    drops the signature2shard rows of the packed ones too: the bytes stay in
    the image, unreferenced."""
    key = winery.add(b"packed, then deleted")
    name = winery.release()
    assert winery.pack_full() == [name]
    winery.delete(key)
    assert winery.clean_deleted() == 1
    assert winery.signature(key) is None
    assert winery.clean() == [name]
    with Shard(winery.image_path(name)) as image:
        assert image.lookup(key) == b"packed, then deleted"


def test_readonly_dsn(winery):
    assert "password=" in winery.readonly_dsn
    key = winery.add(b"readable")
    name = winery.signature(key)[0]  # its table was created after the template
    with winery.connect(readonly=True) as c:
        assert c.execute("SELECT current_user").fetchone()[0] == "guest"
        assert c.execute("SELECT count(*) FROM shards").fetchone()[0] == 1
        assert c.execute("SELECT state::text FROM signature2shard WHERE signature = %s",
                         (key,)).fetchone()[0] == "present"
        assert c.execute(f"SELECT content FROM shard_{name} WHERE key = %s",
                         (key,)).fetchone()[0] == b"readable"
        for sql in ["INSERT INTO signature2shard (signature, state, shard) "
                    "VALUES ('\\x00', 'present', 1)",
                    f"INSERT INTO shard_{name} (key, content) VALUES ('\\x00', '\\x00')",
                    "UPDATE shards SET state = 'full'",
                    "DELETE FROM signature2shard",
                    "CREATE TABLE intruder (x int)"]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(sql)
    bad = winery.readonly_dsn.replace("password=guest", "password=wrong")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(bad).close()


def test_restart_keeps_data(winery, postgres_server):
    key = winery.add(b"survives a restart")
    port, dsn = postgres_server.port, winery.dsn
    postgres_server.restart()
    assert postgres_server.port == port and postgres_server.running
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT state::text FROM signature2shard WHERE signature = %s",
                         (key,)).fetchone()[0] == "present"
    with psycopg.connect(winery.readonly_dsn) as c:
        assert c.execute("SELECT count(*) FROM shards").fetchone()[0] == 1
    # swh's pools reconnect: the storage goes on working
    assert winery.storage.get({"sha256": key}) == b"survives a restart"
    key2 = winery.add(b"added after the restart")

    postgres_server.stop()
    assert not postgres_server.running
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2).close()
    postgres_server.start()
    assert winery.storage.get({"sha256": key2}) == b"added after the restart"
    assert winery.release() and len(winery.pack_full()) == 1
