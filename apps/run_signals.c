/* SIGINT and SIGTERM during `tessera run`: the first asks the run to stop after the step under
 * way (every rank agrees on the step, train.c), write its checkpoint when one is configured and
 * exit with a line saying so; a second exits at once. The fatal signals are crash.c's. */
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "train.h"

/* the first SIGINT or SIGTERM, 0 before one: set by the handler, read by every rank's thread
 * (a lock-free atomic, safe in a handler) */
static atomic_int stop_signal;
static volatile sig_atomic_t speak; /* whether this process writes the acknowledgement */
static int stopped_signal;          /* the run stopped early, on this signal */
static unsigned grace_s;            /* [job] stop_grace_s, rounded up; 0 = no limit */
static int64_t stopped_step, stopped_end;

static void say(const char *s) {
  ssize_t n = write(STDERR_FILENO, s, strlen(s));
  (void)n;
}

static void on_signal(int sig) {
  const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  int first = 0;
  if (!atomic_compare_exchange_strong(&stop_signal, &first, sig)) {
    /* async-signal-safe: write and _exit only */
    if (speak) {
      say("tessera run: ");
      say(name);
      say(" again: exiting at once; nothing more is written\n");
    }
    _exit(128 + sig);
  }
  /* stopping: a log whose reader has gone (mpirun tears its forwarding down when it passes the
   * signal on) must not end the process before the checkpoint is written; a failed write of the
   * log is ignored from now on (sigaction is async-signal-safe) */
  struct sigaction ign;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, NULL);
  if (speak) {
    say("tessera run: ");
    say(name);
    say(": stopping after the current step (send it again to exit at once)\n");
  }
  /* a step wedged in a library call (or a checkpoint on a hung file system) would hold the stop
   * off forever, and launchers such as `timeout` send one signal only */
  if (grace_s) alarm(grace_s);
}

static void on_alarm(int unused) {
  (void)unused;
  int sig = atomic_load(&stop_signal);
  if (speak) {
    say("tessera run: ");
    say(sig == SIGINT ? "SIGINT" : "SIGTERM");
    say(": the step and its checkpoint did not end within [job] stop_grace_s; exiting at once, "
        "nothing more is written\n");
  }
  _exit(128 + (sig ? sig : SIGTERM));
}

void tsr_app_stop_install(bool quiet, double grace) {
  speak = !quiet;
  grace_s = grace <= 0 ? 0 : grace >= 4e9 ? 4000000000u : (unsigned)(grace + 0.999999);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  /* a wait interrupted by the signal resumes: the loop reads the flag between steps */
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = on_alarm;
  sigaction(SIGALRM, &sa, NULL);
}

int tsr_app_stop_signal(void) {
  return atomic_load(&stop_signal);
}

tsr_status tsr_train_stop_agree(tsr_group_t *all, int *sig) {
  int32_t mine = atomic_load(&stop_signal), any = 0;
  TSR_CHECK(tsr_comm_all_reduce(all, &mine, &any, 1, TSR_I32, TSR_REDUCE_MAX));
  *sig = any;
  return TSR_OK;
}

void tsr_app_stop_note(int sig, int64_t step, int64_t end) {
  stopped_signal = sig;
  stopped_step = step;
  stopped_end = end;
}

bool tsr_app_stopped(int *sig, int64_t *step, int64_t *end) {
  if (!stopped_signal) return false;
  *sig = stopped_signal;
  *step = stopped_step;
  *end = stopped_end;
  return true;
}
