/*
 * ll_fast.c — LOOKUP, GETATTR and READ of a mount answered in C alone
 * (ll.h), with the GIL not held.
 */
#include "ll.h"

int ll_fast_lookup(Session *s, fuse_req_t req, fuse_ino_t parent, const char *name)
{
    return 0;
}

int ll_fast_getattr(Session *s, fuse_req_t req, fuse_ino_t ino)
{
    return 0;
}

int ll_fast_read(Session *s, fuse_req_t req, fuse_ino_t ino, size_t size, off_t off)
{
    return 0;
}

void ll_fast_free(struct ll_fast *fast)
{
}
