/* [output] tensorboard: a TensorBoard event file of the run's scalars, written by rank 0 as the
 * run goes. The file is a sequence of records, each
 *
 *   uint64 length, uint32 masked CRC-32C of the length's 8 bytes, data, uint32 masked CRC-32C of
 *   the data (all little-endian; mask: rotate right by 15, add 0xa282ead8),
 *
 * and each record's data is a tensorflow.Event protobuf: the first has file_version
 * "brain.Event:2", every later one a step's Summary of {tag, simple_value} values. The few fields
 * are encoded here by hand rather than through a protobuf library: Event { double wall_time = 1;
 * int64 step = 2; string file_version = 3; Summary summary = 5; }, Summary { repeated Value
 * value = 1; }, Value { string tag = 1; float simple_value = 2; }. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "train.h"
#include "train_log.h"

/* The open event file of a run. */
struct tsr_train_tboard {
  FILE *f;                             /* appended to, flushed after every record */
  char path[TSR_TRAIN_PATH_LEN + 128]; /* for messages */
  bool failed;                         /* a write failed; said at the close */
  int err;                             /* its errno */
};

/* CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), bit by bit: records are a few hundred
 * bytes a step, so a table buys nothing. */
static uint32_t crc32c(const unsigned char *p, size_t n) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return crc ^ 0xffffffffu;
}

/* TensorFlow masks a stored CRC, so that the CRC of data holding CRCs stays strong. */
static uint32_t masked_crc(const unsigned char *p, size_t n) {
  uint32_t crc = crc32c(p, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* ---- protobuf, the little of it the events need ---- */

typedef struct pb {
  unsigned char b[8192];
  size_t n;
  bool over; /* ran out of room: the record is dropped */
} pb;

static void pb_bytes(pb *m, const void *p, size_t n) {
  if (m->over || n > sizeof m->b - m->n) {
    m->over = true;
    return;
  }
  memcpy(m->b + m->n, p, n);
  m->n += n;
}

static void pb_varint(pb *m, uint64_t v) {
  unsigned char buf[10];
  size_t n = 0;
  do {
    buf[n++] = (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  pb_bytes(m, buf, n);
}

/* wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
static void pb_key(pb *m, int field, int wire) {
  pb_varint(m, (uint64_t)field << 3 | (uint64_t)wire);
}

static void pb_le(pb *m, uint64_t v, int bytes) {
  unsigned char buf[8];
  for (int i = 0; i < bytes; i++) buf[i] = (unsigned char)(v >> (8 * i));
  pb_bytes(m, buf, (size_t)bytes);
}

static void pb_double(pb *m, int field, double v) {
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  pb_key(m, field, 1);
  pb_le(m, u, 8);
}

static void pb_float(pb *m, int field, float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  pb_key(m, field, 5);
  pb_le(m, u, 4);
}

static void pb_lenbytes(pb *m, int field, const void *p, size_t n) {
  pb_key(m, field, 2);
  pb_varint(m, n);
  pb_bytes(m, p, n);
}

/* ---- records ---- */

static void put_record(tsr_train_tboard *tb, const pb *m) {
  if (!tb->f || tb->failed) return;
  if (m->over) {
    tb->failed = true;
    tb->err = EOVERFLOW;
    return;
  }
  unsigned char head[12], tail[4];
  uint64_t len = m->n;
  for (int i = 0; i < 8; i++) head[i] = (unsigned char)(len >> (8 * i));
  uint32_t c = masked_crc(head, 8);
  for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(c >> (8 * i));
  c = masked_crc(m->b, m->n);
  for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(c >> (8 * i));
  if (fwrite(head, 1, 12, tb->f) != 12 || fwrite(m->b, 1, m->n, tb->f) != m->n ||
      fwrite(tail, 1, 4, tb->f) != 4 || fflush(tb->f) != 0) {
    tb->failed = true;
    tb->err = errno;
  }
}

void tsr_train_tboard_scalars(tsr_train_log *l, int64_t step, double wall_time, int n,
                              const char *const *tags, const double *values) {
  tsr_train_tboard *tb = l->tboard;
  if (!tb) return;
  pb ev = {.n = 0}, sum = {.n = 0};
  for (int i = 0; i < n; i++) {
    if (!isfinite(values[i])) continue; /* as the metrics' null: the figure does not exist */
    pb val = {.n = 0};
    pb_lenbytes(&val, 1, tags[i], strlen(tags[i]));
    pb_float(&val, 2, (float)values[i]);
    pb_lenbytes(&sum, 1, val.b, val.n);
    sum.over |= val.over;
  }
  pb_double(&ev, 1, wall_time);
  pb_key(&ev, 2, 0);
  pb_varint(&ev, (uint64_t)step);
  pb_lenbytes(&ev, 5, sum.b, sum.n);
  ev.over |= sum.over;
  put_record(tb, &ev);
}

/* ---- the folder and the file ---- */

tsr_status tsr_train_tboard_check(const tsr_config *c) {
  const char *value = tsr_config_ext_of(c)->output_tb.tensorboard;
  if (!value[0]) return TSR_OK;
  char path[TSR_TRAIN_PATH_LEN];
  tsr_train_path(c, value, path, sizeof path);
  return tsr_app_check_out_folder(c, "output", "tensorboard", path, true);
}

tsr_status tsr_train_tboard_open(tsr_train_log *l, const tsr_config *c) {
  const char *value = tsr_config_ext_of(c)->output_tb.tensorboard;
  if (!value[0]) return TSR_OK;
  char dir[TSR_TRAIN_PATH_LEN], host[256] = "localhost", where[TSR_MAX_PATH + 160];
  tsr_train_path(c, value, dir, sizeof dir);
  tsr_config_where(c, "output", "tensorboard", where, sizeof where);
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return tsr_error(TSR_EIO, "%s: %s: cannot create: %s", where, dir, strerror(errno));
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = '\0';
  tsr_train_tboard *tb = calloc(1, sizeof *tb);
  if (!tb) return TSR_ERROR(TSR_ENOMEM, "out of memory");
  /* the name TensorBoard looks for; a second run in the same second gets a suffix, never the
   * first run's file */
  long long now = (long long)time(NULL);
  int fd = -1;
  for (int k = 0; fd < 0 && k < 100; k++) {
    if (k == 0)
      snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%lld.%s", dir, now, host);
    else
      snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%lld.%s.%d", dir, now, host, k);
    fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0 || !(tb->f = fdopen(fd, "w"))) {
    int err = errno;
    if (fd >= 0) close(fd);
    free(tb);
    return tsr_error(TSR_EIO, "%s: cannot create an event file in %s: %s", where, dir,
                     strerror(err));
  }
  l->tboard = tb;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  pb ev = {.n = 0};
  pb_double(&ev, 1, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
  pb_lenbytes(&ev, 3, "brain.Event:2", strlen("brain.Event:2"));
  put_record(tb, &ev);
  return TSR_OK;
}

tsr_status tsr_train_tboard_close(tsr_train_log *l, const tsr_config *c) {
  tsr_train_tboard *tb = l->tboard;
  if (!tb) return TSR_OK;
  l->tboard = NULL;
  bool failed = tb->failed || fflush(tb->f) != 0 || fsync(fileno(tb->f)) != 0;
  int err = tb->failed ? tb->err : errno;
  if (fclose(tb->f) != 0) failed = true;
  tsr_status st = TSR_OK;
  if (failed) {
    char where[TSR_MAX_PATH + 160];
    st = tsr_error(TSR_EIO, "%s: writing %s failed: %s",
                   tsr_config_where(c, "output", "tensorboard", where, sizeof where), tb->path,
                   strerror(err ? err : EIO));
  }
  free(tb);
  return st;
}
