"""Build the shardfs package and its C extension against the system libcmph.

`pip install .` (or `make venv`) needs libcmph-dev, libssl-dev (OpenSSL's libcrypto:
SHA-256 in `shardfs create`) and pkg-config (Debian); with librbd-dev also present,
shards in Ceph RBD images can be read (rbd:POOL/IMAGE sources).
"""
import glob
import os
import subprocess

from setuptools import Extension, setup


def pkg_config(flag, package, default):
    try:
        out = subprocess.run(["pkg-config", flag, package], check=True,
                             capture_output=True, text=True).stdout.split()
        return out or default
    except (OSError, subprocess.CalledProcessError):
        return default


cflags = pkg_config("--cflags-only-I", "cmph", []) + pkg_config("--cflags-only-I", "fuse3", ["-I/usr/include/fuse3"])
libs = (pkg_config("--libs", "cmph", ["-lcmph"]) + pkg_config("--libs", "libcrypto", ["-lcrypto"])
        + pkg_config("--libs", "fuse3", ["-lfuse3"]) + pkg_config("--libs", "libzstd", ["-lzstd"])
        + pkg_config("--libs", "zlib", ["-lz"]) + ["-lpthread", "-ldl"])

# librbd is optional: with its headers, rbd:POOL/IMAGE sources (shardfs/c/rbd.h);
# librados and librbd themselves are loaded (dlopen) at the first such source.
rbd = any(os.path.exists(os.path.join(d, "rbd/librbd.h")) for d in ("/usr/include", "/usr/local/include"))

extension = Extension(
    "shardfs._shardfs",
    # The C core, then the Python binding: module.c (the module) and one
    # py_*.c file per type (py_module.h).
    sources=["shardfs/c/shard.c", "shardfs/c/chd.c", "shardfs/c/chd_build.c", "shardfs/c/writer.c",
             "shardfs/c/sidecar.c", "shardfs/c/output.c", "shardfs/c/gindex.c", "shardfs/c/hashindex.c",
             "shardfs/c/guard.c", "shardfs/c/rbd.c", "shardfs/c/kind_file.c", "shardfs/c/kind_rbd.c", "shardfs/c/kind_mosaic.c", "shardfs/c/remote_copy.c",
             "shardfs/c/s3.c", "shardfs/c/kind_s3.c", "shardfs/c/lookup_pack.c", "shardfs/c/probe.c",
             "shardfs/c/ll_names.c", "shardfs/c/ll_fast.c", "shardfs/c/ll_ahead.c", "shardfs/c/ll_snapshot.c",
             "shardfs/c/ll_resolve.c", "shardfs/c/ll_pool.c", "shardfs/c/mosaic.c", "shardfs/c/gof.c",
             "shardfs/c/module.c"] + sorted(glob.glob("shardfs/c/py_*.c")),
    depends=["shardfs/c/guard.h", "shardfs/c/shard.h", "shardfs/c/sidecar.h",
             "shardfs/c/gindex.h", "shardfs/c/internal.h", "shardfs/c/chd.h",
             "shardfs/c/py_module.h", "shardfs/c/ll.h", "shardfs/c/ll_names.h", "shardfs/c/rbd.h", "shardfs/c/kind.h",
             "shardfs/c/mosaic.h", "shardfs/c/ph.h", "shardfs/c/remote_copy.h",
             "shardfs/c/s3.h", "shardfs/c/lookup_pack.h", "shardfs/c/probe.h", "shardfs/c/ll_pool.h", "shardfs/c/ll_resolve.h", "shardfs/c/ll_snapshot.h"],
    define_macros=[("SFS_HAVE_RBD", "1")] if rbd else [],
    include_dirs=["shardfs/c"] + [f[2:] for f in cflags],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=libs,
)

setup(ext_modules=[extension])
