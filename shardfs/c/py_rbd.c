/* py_rbd.c — _shardfs.rbd_configure() and _shardfs.rbd_list(): the
 * process-wide librbd settings and pool listings of rbd.h; and
 * _shardfs.s3_configure(), the S3 settings of s3.h (the other remote
 * kind). */
#include "py_module.h"
#include "rbd.h"
#include "s3.h"

/* rbd_configure(conf=None, id=None, cache_dir=None, timeout=0, isolate=False, max_images=0) */
PyObject *rbd_configure(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"conf", "id", "cache_dir", "timeout", "isolate", "max_images", NULL};
    const char *conf = NULL, *id = NULL, *cache_dir = NULL;
    unsigned int timeout = 0;
    int isolate = 0;
    Py_ssize_t max_images = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzzIpn", names, &conf, &id, &cache_dir, &timeout,
                                     &isolate, &max_images))
        return NULL;
    if (max_images < 0) {
        PyErr_SetString(PyExc_ValueError, "max_images must be >= 0");
        return NULL;
    }
    sfs_error_t err;
    if (sfs_rbd_configure(conf, id, cache_dir, timeout, isolate, (size_t)max_images, &err) != SFS_OK)
        return raise_error(&err);
    Py_RETURN_NONE;
}

/* rbd_list(pool) -> [image name, ...] */
PyObject *rbd_list(PyObject *mod, PyObject *arg)
{
    const char *pool = PyUnicode_AsUTF8(arg);
    if (!pool)
        return NULL;
    char *names = NULL;
    size_t size = 0;
    sfs_error_t err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_rbd_list(pool, &names, &size, &err);
    Py_END_ALLOW_THREADS
    if (rc != SFS_OK)
        return raise_error(&err);
    PyObject *out = PyList_New(0);
    for (size_t at = 0; out && at < size;) {
        size_t len = strnlen(names + at, size - at);
        PyObject *name = PyUnicode_DecodeUTF8(names + at, (Py_ssize_t)len, "surrogateescape");
        if (!name || PyList_Append(out, name) < 0)
            Py_CLEAR(out);
        Py_XDECREF(name);
        at += len + 1;
    }
    free(names);
    return out;
}

/* rbd_open_images() -> int */
PyObject *rbd_open_images(PyObject *mod, PyObject *unused)
{
    return PyLong_FromSize_t(sfs_rbd_open_images());
}

/* s3_configure(endpoint=None, region=None, timeout=0, cache_dir=None) */
PyObject *s3_configure(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"endpoint", "region", "timeout", "cache_dir", NULL};
    const char *endpoint = NULL, *region = NULL, *cache_dir = NULL;
    unsigned int timeout = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzIz", names, &endpoint, &region, &timeout, &cache_dir))
        return NULL;
    if (sfs_s3_configure(endpoint, region, timeout, cache_dir) != SFS_OK)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}
