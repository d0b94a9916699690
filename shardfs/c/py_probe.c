/*
 * py_probe.c — probe_shards(): sfs_probe_many (probe.h) for Python.
 */
#include "py_module.h"
#include "probe.h"

#include <stdlib.h>

/* probe_shards(paths, prefix_budget=0) -> list */
PyObject *probe_shards(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"paths", "prefix_budget", NULL};
    PyObject *paths_obj, *seq = NULL, *encoded = NULL, *result = NULL;
    unsigned long long budget = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|K", kwlist, &paths_obj, &budget))
        return NULL;
    if (!(seq = PySequence_Fast(paths_obj, "paths must be a sequence of paths")))
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char **paths = calloc((size_t)n + 1, sizeof *paths);
    sfs_probe_t *out = calloc((size_t)n + 1, sizeof *out);
    if (!paths || !out) {
        PyErr_NoMemory();
        goto done;
    }
    if (!(encoded = PyList_New(n)))
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &b))
            goto done;
        PyList_SET_ITEM(encoded, i, b);
        paths[i] = PyBytes_AS_STRING(b);
    }
    sfs_guard_install();
    Py_BEGIN_ALLOW_THREADS
    sfs_probe_many(paths, (size_t)n, out, budget);
    Py_END_ALLOW_THREADS
    if (!(result = PyList_New(n)))
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        sfs_probe_t *p = &out[i];
        PyObject *item;
        if (p->status != SFS_OK) {
            item = Py_NewRef(Py_None);
        } else {
            PyObject *prefixes = Py_NewRef(Py_None);
            if (p->prefixes) {
                Py_DECREF(prefixes);
                prefixes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(p->prefix_count * 8));
                if (prefixes) {
                    char *dst = PyBytes_AS_STRING(prefixes);
                    for (size_t k = 0; k < p->prefix_count; k++) {
                        uint64_t v = htole64(p->prefixes[k]);
                        memcpy(dst + 8 * k, &v, 8);
                    }
                }
            }
            /* st_mtime as os.stat gives it: sec + nsec * 1e-9 */
            double mtime = (double)p->mtime_sec + (double)p->mtime_nsec * 1e-9;
            item = prefixes ? Py_BuildValue(
                                  "(KKKKKLLdKKKy#N)", (unsigned long long)p->dev, (unsigned long long)p->ino,
                                  (unsigned long long)p->rdev, (unsigned long long)p->mode,
                                  (unsigned long long)p->size,
                                  (long long)(p->mtime_sec * 1000000000LL + p->mtime_nsec),
                                  (long long)(p->ctime_sec * 1000000000LL + p->ctime_nsec), mtime,
                                  (unsigned long long)p->objects_count, (unsigned long long)p->slot_count,
                                  (unsigned long long)p->extent, (const char *)p->identity,
                                  (Py_ssize_t)SFS_IDENTITY_SIZE, prefixes)
                            : NULL;
        }
        if (!item) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, item);
    }
done:
    if (out)
        for (Py_ssize_t i = 0; i < n; i++)
            free(out[i].prefixes);
    free(out);
    free(paths);
    Py_XDECREF(encoded);
    Py_DECREF(seq);
    return result;
}
