/* [output] metrics: a JSON Lines file, one object per optimizer step and per evaluation, written
 * by rank 0 as the run goes. The file is made as every output is (a temporary beside the path,
 * renamed over it, keeping the mode of the file it replaces, so a symlink there is replaced and
 * never followed), then appended to line by line, each line flushed as it is written and the
 * file synced at the end: a run killed at any point leaves every line of the steps it logged. A
 * resumed run keeps the lines of the steps up to its checkpoint and appends after them. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train.h"
#include "train_log.h"

/* The step of a line this file wrote ("{"step": N, ..."), or -1. */
static long long line_step(const char *line) {
  long long step = -1;
  if (sscanf(line, "{\"step\": %lld,", &step) != 1) return -1;
  return step;
}

/* The directory of `path` into dir. */
static void dir_of(const char *path, char *dir, size_t len) {
  snprintf(dir, len, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, len, ".");
  else if (slash == dir)
    dir[1] = '\0';
  else
    *slash = '\0';
}

tsr_status tsr_train_metrics_open(tsr_train_log *l, const tsr_config *c, int64_t start_step) {
  const char *value = tsr_config_ext_of(c)->output.metrics;
  if (!value[0]) return TSR_OK;
  char path[TSR_TRAIN_PATH_LEN], tmp[TSR_TRAIN_PATH_LEN + 32], dir[TSR_TRAIN_PATH_LEN],
      where[TSR_MAX_PATH + 160];
  tsr_train_path(c, value, path, sizeof path);
  tsr_config_where(c, "output", "metrics", where, sizeof where);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld.XXXXXX", path, (long)getpid());
  int fd = mkstemp(tmp);
  if (fd < 0)
    return tsr_error(TSR_EIO, "%s: %s: cannot create a file beside it: %s", where, path,
                     strerror(errno));
  /* the mode of the file replaced, or what a new file gets (0666 less the umask) */
  struct stat sb;
  mode_t mask = umask(0);
  umask(mask);
  bool had = lstat(path, &sb) == 0 && S_ISREG(sb.st_mode);
  if (fchmod(fd, had ? sb.st_mode & 07777 : 0666 & ~mask) != 0) {
    /* keep going: the file is still written, with mkstemp's 0600 */
  }
  FILE *f = fdopen(fd, "w");
  if (!f) {
    close(fd);
    unlink(tmp);
    return tsr_error(TSR_EIO, "%s: %s: %s", where, tmp, strerror(errno));
  }
  /* a resumed run keeps what the run before it wrote up to the checkpoint */
  int64_t kept = 0;
  FILE *old = start_step > 0 && had ? fopen(path, "r") : NULL;
  if (old) {
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, old) > 0) {
      long long step = line_step(line);
      if (step < 1 || step > start_step) continue;
      fputs(line, f);
      kept++;
    }
    free(line);
    fclose(old);
  }
  if (fflush(f) != 0 || fsync(fileno(f)) != 0 || rename(tmp, path) != 0) {
    int err = errno;
    fclose(f);
    unlink(tmp);
    return tsr_error(TSR_EIO, "%s: %s: %s", where, path, strerror(err));
  }
  dir_of(path, dir, sizeof dir);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  l->metrics = f;
  l->metrics_kept = kept;
  return TSR_OK;
}

tsr_status tsr_train_metrics_close(tsr_train_log *l, const tsr_config *c) {
  if (!l->metrics) return TSR_OK;
  FILE *f = l->metrics;
  l->metrics = NULL;
  bool failed = l->metrics_failed || fflush(f) != 0 || fsync(fileno(f)) != 0;
  int err = errno;
  if (fclose(f) != 0) failed = true;
  if (!failed) return TSR_OK;
  char where[TSR_MAX_PATH + 160];
  return tsr_error(TSR_EIO, "%s: writing the metrics failed: %s",
                   tsr_config_where(c, "output", "metrics", where, sizeof where),
                   strerror(err ? err : EIO));
}
