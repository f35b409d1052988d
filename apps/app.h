/* Shared by the `tessera` subcommands. */
#ifndef TESSERA_APP_H
#define TESSERA_APP_H

#include "tessera/config.h"
#include "tessera/plugin.h"
#include "tessera/registry.h"

/* Exit codes, as documented in --help and docs/cli.md. */
#define TSR_EXIT_OK        0
#define TSR_EXIT_RUNTIME   1
#define TSR_EXIT_BAD_INPUT 2

/* The exit code for a failed status: bad input (the job file, the command line, a plugin that
 * does not load or rejects the job) is 2, everything else 1. */
int tsr_app_exit_code(tsr_status s);

/* A job read, checked and with its plugins loaded: what plan and run both start from. */
typedef struct tsr_app_job {
  tsr_config *cfg;
  tsr_registry_t *reg;
  tsr_plugin_set_t *plugins;
  tsr_mesh_t *mesh;
} tsr_app_job;

/* Loads everything, applying `nset` "section.key=value" overrides (tsr_config_set) to the job file
 * before its plugins load; on failure prints the error to stderr and frees what was made. */
tsr_status tsr_app_job_open(const char *path, int nset, const char *const *sets, tsr_app_job *job);
void tsr_app_job_close(tsr_app_job *job);
/* The job's files, before anything is built (job_files.c): the job file, the data file and the
 * checkpoint to load (with its optimizer file when present) are regular files that open for
 * reading; every output ([checkpoint] save and its optimizer file in train mode, [output] dump
 * and trace) is absent or a regular file, in an existing directory this process may write; no
 * output is the same file (device and inode) as an input, except a checkpoint saved over the one
 * loaded, and no two outputs share a path. TSR_EINVAL naming the key, its line and the fix. */
tsr_status tsr_app_check_files(const tsr_config *c);
/* An output folder of [section] key (made when absent): an existing one must be a directory, and
 * writable when `writable`; an absent one needs an existing parent. TSR_EINVAL naming the key. */
tsr_status tsr_app_check_out_folder(const tsr_config *c, const char *section, const char *key,
                                    const char *path, bool writable);
/* Prints the mesh (rank -> coordinates), dim owners, plugins and registry contents. */
void tsr_app_print_plan(const tsr_app_job *job, FILE *f);

int tsr_cmd_plugins(int argc, char **argv);
int tsr_cmd_plan(int argc, char **argv);
int tsr_cmd_run(int argc, char **argv);
int tsr_cmd_ini_reference(int argc, char **argv);
int tsr_cmd_compare(int argc, char **argv);

/* True when argv holds -h or --help. */
bool tsr_app_wants_help(int argc, char **argv);
/* A --set SECTION.KEY=VALUE of `tessera CMD` whose value is a path (or plugins.path's list),
 * made absolute from the current directory, since the job file's own paths are relative to the
 * job file; other keys copied. malloc'd; NULL, with the reason on stderr, when the current
 * directory cannot be read: an override is never dropped or cut. */
char *tsr_app_absolute_set(const char *cmd, const char *assignment);

/* Crash reports (crash.c): from now on a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL)
 * in any thread prints "<prog>: rank R crashed (SIG...) in plugin P, <callback> <name> (<phase>),
 * step S, microbatch M" from that thread's breadcrumb and exits 1. Sets up the calling thread's
 * alternate signal stack; every other thread that may overflow its stack (a rank's) brackets its
 * work with tsr_app_crash_thread_begin / _end (NULL when none could be made: the report then
 * needs the thread's own stack). */
void tsr_app_crash_install(const char *prog);
void *tsr_app_crash_thread_begin(void);
void tsr_app_crash_thread_end(void *stack);

#endif
