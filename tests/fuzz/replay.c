/*
 * replay.c — run a fuzz harness's LLVMFuzzerTestOneInput over files,
 * without libFuzzer: for gcc sanitizer builds (make test-asan) and
 * valgrind (make test-valgrind), and to reproduce a crash in a debugger.
 *
 *   replay_shard FILE_OR_DIR...   each file once; a directory: its files
 *
 * Exits 0 after printing how many inputs ran; a failed invariant or a
 * sanitizer error aborts with a non-zero status, as under libFuzzer.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned long ran;

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) < 0) {
        perror(path);
        fclose(f);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    /* an exact-size heap block: a read past the input is caught by ASan */
    uint8_t *data = malloc(size ? size : 1);
    if (!data || fread(data, 1, size, f) != size) {
        fprintf(stderr, "%s: read failed\n", path);
        free(data);
        fclose(f);
        return -1;
    }
    fclose(f);
    if (getenv("REPLAY_VERBOSE"))
        fprintf(stderr, "replay %s (%zu bytes)\n", path, size);
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    ran++;
    return 0;
}

static int run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0) {
        perror(path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return run_file(path);
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    if (n < 0) {
        perror(path);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.' && rc == 0) {
            char *p;
            if (asprintf(&p, "%s/%s", path, names[i]->d_name) < 0) {
                rc = -1;
            } else {
                struct stat fst;
                if (stat(p, &fst) == 0 && S_ISREG(fst.st_mode))
                    rc = run_file(p);
                free(p);
            }
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i]) < 0)
            return 1;
    printf("%s: %lu inputs replayed, no crash\n", argv[0], ran);
    return 0;
}
