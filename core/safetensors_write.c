/* Safetensors writer: temporary file, fsync, rename. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io_internal.h"

/* A growable string for the JSON header. */
typedef struct strbuf {
  char *p;
  size_t len, cap;
  bool oom;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void sb_str(strbuf *b, const char *s) {
  sb_put(b, s, strlen(s));
}

static void sb_u64(strbuf *b, uint64_t v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
  sb_put(b, tmp, (size_t)n);
}

/* A JSON string literal. Names are bytes; only what JSON forbids raw is escaped. */
static void sb_json(strbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      char e[2] = {'\\', (char)*p};
      sb_put(b, e, 2);
    } else if (*p < 0x20) {
      char e[8];
      snprintf(e, sizeof e, "\\u%04x", *p);
      sb_put(b, e, 6);
    } else {
      sb_put(b, (const char *)p, 1);
    }
  }
  sb_put(b, "\"", 1);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name that appears twice, or NULL. */
static const char *find_duplicate(int n, const char *const *names, tsr_status *s) {
  *s = TSR_OK;
  if (n < 2) return NULL;
  const char **sorted = malloc((size_t)n * sizeof *sorted);
  if (!sorted) {
    *s = TSR_ENOMEM;
    return NULL;
  }
  memcpy(sorted, names, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
  const char *dup = NULL;
  for (int i = 1; i < n && !dup; i++)
    if (strcmp(sorted[i - 1], sorted[i]) == 0) dup = sorted[i];
  free(sorted);
  return dup;
}

static tsr_status check_args(const char *path, int n, const char *const *names,
                             const tsr_tensor *const *tensors, int nmeta, const char *const *keys,
                             const char *const *values) {
  if (n < 0 || nmeta < 0 || (n > 0 && (!names || !tensors)) || (nmeta > 0 && (!keys || !values)))
    return TSR_ERROR(TSR_EINVAL, "%s: bad tensor or metadata list (n = %d, nmeta = %d)", path, n,
                     nmeta);
  for (int i = 0; i < n; i++) {
    if (!names[i]) return TSR_ERROR(TSR_EINVAL, "%s: tensor %d has no name", path, i);
    if (!tensors[i])
      return TSR_ERROR(TSR_EINVAL, "%s: tensor %d ('%s') is NULL", path, i, names[i]);
    if (strcmp(names[i], "__metadata__") == 0)
      return TSR_ERROR(TSR_EINVAL, "%s: \"__metadata__\" is reserved and cannot name a tensor",
                       path);
    if ((unsigned)tensors[i]->dtype >= TSR_DTYPE_COUNT)
      return TSR_ERROR(TSR_EINVAL, "%s: tensor '%s' has an invalid dtype %d", path, names[i],
                       (int)tensors[i]->dtype);
  }
  for (int i = 0; i < nmeta; i++)
    if (!keys[i] || !values[i])
      return TSR_ERROR(TSR_EINVAL, "%s: metadata entry %d has a NULL key or value", path, i);
  tsr_status s;
  const char *dup = find_duplicate(n, names, &s);
  if (s != TSR_OK) return TSR_ERROR(s, "%s: out of memory checking tensor names", path);
  if (dup) return TSR_ERROR(TSR_EINVAL, "%s: tensor name '%s' is given twice", path, dup);
  dup = find_duplicate(nmeta, keys, &s);
  if (s != TSR_OK) return TSR_ERROR(s, "%s: out of memory checking metadata keys", path);
  if (dup) return TSR_ERROR(TSR_EINVAL, "%s: metadata key '%s' is given twice", path, dup);
  return TSR_OK;
}

/* The header, padded with spaces so that 8 + its length is a multiple of 8. */
static tsr_status build_header(const char *path, int n, const char *const *names,
                               const tsr_tensor *const *tensors, int nmeta, const char *const *keys,
                               const char *const *values, strbuf *b) {
  sb_str(b, "{");
  if (nmeta > 0) {
    sb_str(b, "\"__metadata__\":{");
    for (int i = 0; i < nmeta; i++) {
      if (i) sb_str(b, ",");
      sb_json(b, keys[i]);
      sb_str(b, ":");
      sb_json(b, values[i]);
    }
    sb_str(b, "}");
  }
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    const tsr_tensor *t = tensors[i];
    if (i || nmeta > 0) sb_str(b, ",");
    sb_json(b, names[i]);
    sb_str(b, ":{\"dtype\":\"");
    sb_str(b, tsr_st_dtypes[tsr_st_dtype_from_tsr(t->dtype)].name);
    sb_str(b, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      if (d) sb_str(b, ",");
      sb_u64(b, (uint64_t)t->shape[d]);
    }
    sb_str(b, "],\"data_offsets\":[");
    sb_u64(b, off);
    sb_str(b, ",");
    off += tsr_tensor_nbytes(t);
    sb_u64(b, off);
    sb_str(b, "]}");
  }
  sb_str(b, "}");
  while (b->len % 8) sb_str(b, " ");
  if (b->oom) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory building the header", path);
  return TSR_OK;
}

/* Creates `path.tmp.<pid>.<random>` exclusively, so that two writers never share one. The file
 * takes the mode of an existing `path` (replacing a file keeps its permissions); a new one gets
 * 0666 less the umask, as any created file. */
static tsr_status create_temp(const char *path, char **tmp_out, int *fd_out) {
  size_t len = strlen(path) + 64;
  char *tmp = malloc(len);
  if (!tmp) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory", path);
  struct stat old;
  bool keep_mode = stat(path, &old) == 0 && S_ISREG(old.st_mode);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  /* Time, pid and a stack address mixed: distinct across processes and threads. */
  uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)(uintptr_t)&ts;
  for (int attempt = 0; attempt < 16; attempt++) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    snprintf(tmp, len, "%s.tmp.%ld.%08llx", path, (long)getpid(),
             (unsigned long long)(z & 0xffffffffu));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      if (keep_mode && fchmod(fd, old.st_mode & 07777) != 0) {
        tsr_status s = TSR_ERROR(TSR_EIO,
                                 "%s: cannot give %s the mode %04o of the file it "
                                 "replaces: %s",
                                 path, tmp, (unsigned)(old.st_mode & 07777), strerror(errno));
        close(fd);
        unlink(tmp);
        free(tmp);
        return s;
      }
      *tmp_out = tmp;
      *fd_out = fd;
      return TSR_OK;
    }
    if (errno != EEXIST) {
      tsr_status s = TSR_ERROR(TSR_EIO,
                               "%s: cannot create the temporary file %s: %s; check that "
                               "the directory exists and is writable",
                               path, tmp, strerror(errno));
      free(tmp);
      return s;
    }
  }
  free(tmp);
  return TSR_ERROR(TSR_EIO, "%s: cannot find a free temporary file name beside it", path);
}

static tsr_status write_all(FILE *f, const char *path, const char *tmp, const void *p, size_t n) {
  if (n && fwrite(p, 1, n, f) != n)
    return TSR_ERROR(TSR_EIO, "%s: write to %s failed: %s", path, tmp, strerror(errno));
  return TSR_OK;
}

static tsr_status write_tensor(FILE *f, const char *path, const char *tmp, const char *name,
                               const tsr_tensor *t) {
  bool host = tsr_tensor_device(t).kind == TSR_DEVICE_CPU;
  if (host && tsr_tensor_is_contiguous(t))
    return write_all(f, path, tmp, tsr_tensor_data(t), tsr_tensor_nbytes(t));
  /* a strided or device tensor is written from a contiguous host copy */
  tsr_tensor *c = NULL;
  tsr_status s = tsr_tensor_to(t, NULL, &c);
  if (s != TSR_OK) return tsr_error_prefix(s, "%s: tensor '%s'", path, name);
  s = write_all(f, path, tmp, tsr_tensor_data(c), tsr_tensor_nbytes(c));
  tsr_tensor_free(c);
  return s;
}

/* The directory part of `path` ("." without one), malloc'd; NULL when out of memory. */
static char *parent_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  size_t n = !slash ? 1 : slash == path ? 1 : (size_t)(slash - path);
  char *dir = malloc(n + 1);
  if (!dir) return NULL;
  if (!slash)
    dir[0] = '.';
  else
    memcpy(dir, path, n);
  dir[n] = '\0';
  return dir;
}

/* Makes the rename itself durable. Best effort: some file systems refuse fsync on directories,
 * and the data is already safe in the file. */
static void sync_parent_dir(const char *path) {
  char *dir = parent_dir(path);
  if (!dir) return;
  int fd = open(dir, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
  free(dir);
}

bool tsr_st_temp_of(const char *path, const char *name, long *pid) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t bl = strlen(base);
  if (strncmp(name, base, bl) != 0 || strncmp(name + bl, ".tmp.", 5) != 0) return false;
  const char *p = name + bl + 5;
  char *end;
  errno = 0;
  long v = strtol(p, &end, 10);
  if (errno || end == p || v <= 0 || *end != '.') return false;
  p = end + 1;
  for (int i = 0; i < 8; i++)
    if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) return false;
  if (p[8]) return false;
  if (pid) *pid = v;
  return true;
}

void tsr_st_remove_stale(const char *path) {
  char *dir = parent_dir(path);
  if (!dir) return;
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    long self = (long)getpid();
    while ((e = readdir(d))) {
      long pid = 0;
      if (!tsr_st_temp_of(path, e->d_name, &pid) || pid == self) continue;
      /* only a writer that is gone: a live one may be another job saving beside this one */
      if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
      (void)unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
  }
  free(dir);
}

tsr_status tsr_st_write_temp(const char *path, int n, const char *const *names,
                             const tsr_tensor *const *tensors, int nmeta,
                             const char *const *meta_keys, const char *const *meta_values,
                             tsr_save_point half, char **tmp_out) {
  *tmp_out = NULL;
  if (!path) return TSR_ERROR(TSR_EINVAL, "safetensors save: NULL path");
  if (!tsr_st_host_is_little_endian())
    return TSR_ERROR(TSR_ENOTSUP, "%s: safetensors data is little-endian and this host is not",
                     path);
  TSR_CHECK(check_args(path, n, names, tensors, nmeta, meta_keys, meta_values));
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
    return TSR_ERROR(TSR_EINVAL, "%s: is a directory; give a file path", path);

  tsr_status s = TSR_OK;
  strbuf hdr = {0};
  char *tmp = NULL;
  int fd = -1;
  FILE *f = NULL;
  TSR_CHECK_GOTO(build_header(path, n, names, tensors, nmeta, meta_keys, meta_values, &hdr), s);
  TSR_CHECK_GOTO(create_temp(path, &tmp, &fd), s);
  f = fdopen(fd, "wb");
  if (!f) {
    s = TSR_ERROR(TSR_EIO, "%s: cannot open a stream on its temporary file: %s", path,
                  strerror(errno));
    goto cleanup;
  }
  fd = -1; /* the stream owns it now */
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
  TSR_CHECK_GOTO(write_all(f, path, tmp, len8, 8), s);
  TSR_CHECK_GOTO(write_all(f, path, tmp, hdr.p, hdr.len), s);
  for (int i = 0; i < n; i++) {
    if (half && i == n / 2 && fflush(f) == 0) tsr_save_point_reached(half);
    TSR_CHECK_GOTO(write_tensor(f, path, tmp, names[i], tensors[i]), s);
  }
  if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
    s = TSR_ERROR(TSR_EIO, "%s: flushing %s failed: %s", path, tmp, strerror(errno));
    goto cleanup;
  }
  int rc = fclose(f);
  f = NULL;
  if (rc != 0) {
    s = TSR_ERROR(TSR_EIO, "%s: closing %s failed: %s", path, tmp, strerror(errno));
    goto cleanup;
  }
  *tmp_out = tmp;
  tmp = NULL;
cleanup:
  if (f) fclose(f);
  if (fd >= 0) close(fd);
  if (tmp) {
    unlink(tmp);
    free(tmp);
  }
  free(hdr.p);
  return s;
}

tsr_status tsr_st_publish(const char *tmp, const char *path) {
  if (rename(tmp, path) != 0) {
    tsr_status s =
        TSR_ERROR(TSR_EIO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
    unlink(tmp);
    return s;
  }
  sync_parent_dir(path);
  return TSR_OK;
}

tsr_status tsr_safetensors_save(const char *path, int n, const char *const *names,
                                const tsr_tensor *const *tensors, int nmeta,
                                const char *const *meta_keys, const char *const *meta_values) {
  char *tmp = NULL;
  TSR_CHECK(tsr_st_write_temp(path, n, names, tensors, nmeta, meta_keys, meta_values, TSR_SAVE_NONE,
                              &tmp));
  tsr_status s = tsr_st_publish(tmp, path);
  free(tmp);
  if (s == TSR_OK) tsr_st_remove_stale(path);
  return s;
}

tsr_status tsr_file_write_atomic(const char *path, const void *data, size_t len) {
  if (!path || (len && !data)) return TSR_ERROR(TSR_EINVAL, "file write: NULL path or data");
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
    return TSR_ERROR(TSR_EINVAL, "%s: is a directory; give a file path", path);
  char *tmp = NULL;
  int fd = -1;
  TSR_CHECK(create_temp(path, &tmp, &fd));
  tsr_status s = TSR_OK;
  const char *p = data;
  size_t left = len;
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      s = TSR_ERROR(TSR_EIO, "%s: write to %s failed: %s", path, tmp,
                    w < 0 ? strerror(errno) : "no progress");
      break;
    }
    p += w;
    left -= (size_t)w;
  }
  if (s == TSR_OK && fsync(fd) != 0)
    s = TSR_ERROR(TSR_EIO, "%s: flushing %s failed: %s", path, tmp, strerror(errno));
  if (close(fd) != 0 && s == TSR_OK)
    s = TSR_ERROR(TSR_EIO, "%s: closing %s failed: %s", path, tmp, strerror(errno));
  if (s != TSR_OK) {
    unlink(tmp);
    free(tmp);
    return s;
  }
  s = tsr_st_publish(tmp, path);
  free(tmp);
  if (s == TSR_OK) tsr_st_remove_stale(path);
  return s;
}
