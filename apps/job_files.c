/* The job's files, checked before anything is built or run: every input opens, every output can
 * be written, and no output replaces an input. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app.h"
#include "hf.h"
#include "tessera/io.h"
#include "train.h"
#include "train_ckpt.h"
#include "train_log.h"

#define MAX_FILES 8

/* One file of the job: where it was set, its path resolved, and what is known of it. */
typedef struct job_file {
  const char *section, *key;
  const char *what; /* "" or a qualifier such as "optimizer file of" */
  char path[TSR_TRAIN_PATH_LEN + 32];
  bool exists;
  bool may_be_absent; /* the model file of a save killed between its two renames */
  struct stat sb;
} job_file;

static const char *kind_of(mode_t m) {
  return S_ISDIR(m)    ? "a directory"
         : S_ISFIFO(m) ? "a FIFO"
         : S_ISSOCK(m) ? "a socket"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
                       : "not a regular file";
}

static tsr_status file_error(const tsr_config *c, const job_file *f, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tsr_status file_error(const tsr_config *c, const job_file *f, const char *fmt, ...) {
  char msg[TSR_TRAIN_PATH_LEN + 512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return tsr_config_error(c, TSR_EINVAL, f->section, f->key, "%s%s%s", f->what, f->path, msg);
}

/* An input: a regular file that opens for reading. The open does not block on a FIFO: it is
 * refused by its type first, and O_NONBLOCK covers a file swapped for one in between. */
static tsr_status check_input(const tsr_config *c, job_file *f) {
  if (stat(f->path, &f->sb) != 0 && errno == ENOENT && f->may_be_absent) return TSR_OK;
  if (stat(f->path, &f->sb) != 0)
    return file_error(c, f,
                      ": cannot open: %s; check the path (relative paths start at the job "
                      "file's directory)",
                      strerror(errno));
  f->exists = true;
  if (!S_ISREG(f->sb.st_mode))
    return file_error(c, f, " is %s; give a regular file", kind_of(f->sb.st_mode));
  int fd = open(f->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return file_error(c, f, ": cannot open: %s", strerror(errno));
  close(fd);
  return TSR_OK;
}

/* An output: absent or a regular file, in an existing directory this process can write. */
static tsr_status check_output(const tsr_config *c, job_file *f) {
  if (stat(f->path, &f->sb) == 0) {
    f->exists = true;
    if (S_ISDIR(f->sb.st_mode))
      return file_error(c, f, " is a directory; give a file path inside it");
    if (!S_ISREG(f->sb.st_mode))
      return file_error(c, f, " is %s; an output is replaced by a new file: give a file path",
                        kind_of(f->sb.st_mode));
  }
  char dir[sizeof f->path];
  snprintf(dir, sizeof dir, "%s", f->path);
  char *slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else if (slash == dir)
    dir[1] = '\0';
  else
    *slash = '\0';
  struct stat ds;
  if (stat(dir, &ds) != 0)
    return file_error(c, f, ": its directory %s does not exist (%s); create it first", dir,
                      strerror(errno));
  if (!S_ISDIR(ds.st_mode)) return file_error(c, f, ": %s is not a directory", dir);
  if (access(dir, W_OK | X_OK) != 0)
    return file_error(c, f, ": its directory %s is not writable (%s); pick another path", dir,
                      strerror(errno));
  return TSR_OK;
}

/* The checkpoint a run loads may be the one it saves (a resume in place): it is read whole
 * before any step and replaced atomically after the last. Every other overlap replaces an input. */
static bool resume_in_place(const job_file *in, const job_file *out) {
  return !strcmp(in->section, "checkpoint") && !strcmp(out->section, "checkpoint") &&
         !strcmp(in->what, out->what);
}

static bool same_file(const job_file *a, const job_file *b) {
  return a->exists && b->exists && a->sb.st_dev == b->sb.st_dev && a->sb.st_ino == b->sb.st_ino;
}

static void label(char *buf, size_t len, const job_file *f) {
  snprintf(buf, len, "%s[%s] %s", f->what, f->section, f->key);
}

/* Appends a file set by [section] key: `value` resolved against the job file's directory, or
 * `resolved` as it is. */
static void add(const tsr_config *c, job_file *files, int *n, const char *section, const char *key,
                const char *what, const char *value, const char *resolved) {
  job_file *f = &files[(*n)++];
  memset(f, 0, sizeof *f);
  f->section = section;
  f->key = key;
  f->what = what;
  if (resolved)
    snprintf(f->path, sizeof f->path, "%s", resolved);
  else
    tsr_train_path(c, value, f->path, sizeof f->path);
}

tsr_status tsr_app_check_out_folder(const tsr_config *c, const char *section, const char *key,
                                    const char *path, bool writable) {
  char parent[TSR_TRAIN_PATH_LEN];
  struct stat sb;
  if (stat(path, &sb) == 0) {
    if (!S_ISDIR(sb.st_mode))
      return tsr_config_error(c, TSR_EINVAL, section, key,
                              "%s is not a directory; give a folder (it is made when absent)",
                              path);
    if (writable && access(path, W_OK | X_OK) != 0)
      return tsr_config_error(c, TSR_EINVAL, section, key,
                              "%s is not writable (%s); pick another folder", path,
                              strerror(errno));
    return TSR_OK;
  }
  if (snprintf(parent, sizeof parent, "%s", path) >= (int)sizeof parent)
    return tsr_config_error(c, TSR_EINVAL, section, key, "%s is too long; use a shorter path",
                            path);
  size_t n = strlen(parent);
  while (n > 1 && parent[n - 1] == '/') parent[--n] = '\0';
  char *slash = strrchr(parent, '/');
  if (!slash)
    snprintf(parent, sizeof parent, ".");
  else if (slash == parent)
    parent[1] = '\0';
  else
    *slash = '\0';
  if (stat(parent, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return tsr_config_error(c, TSR_EINVAL, section, key,
                            "%s: its parent %s is not an existing directory; create it first", path,
                            parent);
  return TSR_OK;
}

tsr_status tsr_app_check_files(const tsr_config *c) {
  job_file in[MAX_FILES], out[MAX_FILES];
  int nin = 0, nout = 0;
  /* the job file itself, as given */
  memset(&in[0], 0, sizeof in[0]);
  in[0].section = "job";
  in[0].key = "file";
  in[0].what = "the job file ";
  snprintf(in[0].path, sizeof in[0].path, "%s", c->path);
  in[0].exists = stat(c->path, &in[0].sb) == 0;
  nin = 1;
  const char *colon = strchr(c->data.source, ':');
  if (colon && colon[1]) add(c, in, &nin, "data", "source", "", colon + 1, NULL);
  /* the held-out data: its keys first, so that a source without a use is said so */
  TSR_CHECK(tsr_train_eval_check(c));
  TSR_CHECK(tsr_train_ckpt_check(c));   /* [checkpoint] dir, every, keep_last, load = latest */
  TSR_CHECK(tsr_train_tboard_check(c)); /* [output] tensorboard: a folder */
  const char *eval = tsr_config_ext_of(c)->eval.source;
  colon = strchr(eval, ':');
  if (colon && colon[1]) add(c, in, &nin, "eval", "source", "", colon + 1, NULL);
  char optim[TSR_TRAIN_PATH_LEN + 32];
  char folder[TSR_TRAIN_PATH_LEN];
  /* a Hugging Face folder is checked by its reader (tsr_hf_job_apply, tsr_hf_weights_open) */
  if (c->checkpoint.load[0] && !tsr_train_ckpt_wants_load(c) &&
      !tsr_hf_is_folder(tsr_train_path(c, c->checkpoint.load, folder, sizeof folder))) {
    add(c, in, &nin, "checkpoint", "load", "", c->checkpoint.load, NULL);
    TSR_CHECK(tsr_checkpoint_optim_path(in[nin - 1].path, optim, sizeof optim));
    struct stat sb;
    if (stat(optim, &sb) == 0 || errno != ENOENT) {
      /* with the optimizer file there, the load finds the model file of a save killed before
       * it was renamed into place (tsr_checkpoint_pair), or says why not */
      in[nin - 1].may_be_absent = true;
      add(c, in, &nin, "checkpoint", "load", "the optimizer file ", NULL, optim);
    }
  }
  /* the checkpoint is saved by training runs only */
  if (c->checkpoint.save[0] && c->job.mode == TSR_MODE_TRAIN) {
    add(c, out, &nout, "checkpoint", "save", "", c->checkpoint.save, NULL);
    TSR_CHECK(tsr_checkpoint_optim_path(out[nout - 1].path, optim, sizeof optim));
    add(c, out, &nout, "checkpoint", "save", "the optimizer file ", NULL, optim);
  }
  if (c->output.dump[0]) add(c, out, &nout, "output", "dump", "", c->output.dump, NULL);
  if (c->output.trace[0]) add(c, out, &nout, "output", "trace", "", c->output.trace, NULL);
  const char *metrics = tsr_config_ext_of(c)->output.metrics;
  if (metrics[0]) add(c, out, &nout, "output", "metrics", "", metrics, NULL);

  for (int i = 1; i < nin; i++) TSR_CHECK(check_input(c, &in[i]));
  for (int i = 0; i < nout; i++) TSR_CHECK(check_output(c, &out[i]));
  char a[128];
  for (int i = 0; i < nout; i++) {
    for (int k = 0; k < nin; k++) {
      if (!same_file(&out[i], &in[k]) || resume_in_place(&in[k], &out[i])) continue;
      label(a, sizeof a, &in[k]);
      return tsr_config_error(c, TSR_EINVAL, out[i].section, out[i].key,
                              "%s%s is the same file as %s (%s): writing it would replace an "
                              "input of the job; pick another path",
                              out[i].what, out[i].path, k == 0 ? "the job file" : a, in[k].path);
    }
    for (int k = 0; k < i; k++) {
      bool same = same_file(&out[i], &out[k]) || !strcmp(out[i].path, out[k].path);
      if (!same) continue;
      label(a, sizeof a, &out[k]);
      return tsr_config_error(c, TSR_EINVAL, out[i].section, out[i].key,
                              "%s%s is also %s: one output would overwrite the other; give "
                              "each its own path",
                              out[i].what, out[i].path, a);
    }
  }
  return TSR_OK;
}
