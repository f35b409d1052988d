/* Temporary directories and raw file helpers for the I/O tests. */
#ifndef TESSERA_TEST_IO_UTIL_H
#define TESSERA_TEST_IO_UTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A fresh directory under /tmp; `buf` gets its path. */
static inline void io_tmpdir(char *buf, size_t len) {
  snprintf(buf, len, "/tmp/tessera-io-XXXXXX");
  if (!mkdtemp(buf)) {
    perror("mkdtemp");
    abort();
  }
}

/* Removes a directory made by io_tmpdir and everything in it, one level of subdirectories. */
static inline void io_rmtree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[4096];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
    struct stat sb;
    if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
      chmod(p, 0700);
      io_rmtree(p);
    } else {
      unlink(p);
    }
  }
  closedir(d);
  rmdir(dir);
}

/* Number of entries in `dir`, "." and ".." excluded. */
static inline int io_count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static inline void io_write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
    perror(path);
    abort();
  }
}

/* The whole file in a malloc'd buffer; `*n` gets its size. */
static inline unsigned char *io_read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *p = malloc((size_t)sz + 1);
  if (fread(p, 1, (size_t)sz, f) != (size_t)sz) abort();
  fclose(f);
  *n = (size_t)sz;
  return p;
}

/* A safetensors file made of `header` (not padded) and `dlen` data bytes. */
static inline void io_write_st(const char *path, const char *header, const void *data,
                               size_t dlen) {
  size_t hlen = strlen(header), n = 8 + hlen + dlen;
  unsigned char *b = malloc(n);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  memcpy(b + 8, header, hlen);
  if (dlen) memcpy(b + 8 + hlen, data, dlen);
  io_write_file(path, b, n);
  free(b);
}

#endif
