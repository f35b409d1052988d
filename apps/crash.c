/* A fatal signal in `tessera run` becomes one line naming the rank and what it was running, read
 * from the crashing thread's breadcrumb (tessera/breadcrumb.h), and exit code 1:
 *
 *   tessera run: rank 3 crashed (SIGSEGV) in plugin cp_ring, op rule cp_ring.sdpa (forward),
 *   step 2, microbatch 1
 *
 * The handler is async-signal-safe: it reads the thread-local breadcrumb, formats into a buffer
 * on its own stack (numbers by hand, no printf, no malloc), writes it with write(2) and leaves
 * with _exit(1). It runs on an alternate stack, so that a stack overflow is reported too; the
 * alternate stack is per thread, so each rank's thread sets one up (tsr_app_crash_thread_begin).
 * When several threads crash at once, the first one to get here reports and ends the process;
 * the others wait for that. The handler belongs to the program, not the library: library code
 * never ends the process. */
#define _DEFAULT_SOURCE /* sigaltstack, SA_ONSTACK */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "app.h"
#include "tessera/breadcrumb.h"

#define CRASH_STACK_BYTES ((size_t)64 << 10)
#define CRASH_FIELD_MAX   160 /* bytes of each name written, so that a bad pointer's string ends */

static const char *crash_prog = "tessera";
static int crash_reporting; /* set by the first thread to report */

typedef struct crash_line {
  char buf[1024];
  size_t n;
} crash_line;

static void put(crash_line *l, const char *s) {
  for (size_t k = 0; s && s[k] && k < CRASH_FIELD_MAX && l->n < sizeof l->buf - 1; k++)
    l->buf[l->n++] = s[k];
}

static void put_int(crash_line *l, int64_t v) {
  char digits[24];
  int k = 0;
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do {
    digits[k++] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0) put(l, "-");
  while (k > 0 && l->n < sizeof l->buf - 1) l->buf[l->n++] = digits[--k];
}

static bool same(const char *a, const char *b) {
  while (*a && *a == *b) a++, b++;
  return *a == *b;
}

static const char *signal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGABRT:
      return "SIGABRT";
    case SIGILL:
      return "SIGILL";
  }
  return "a fatal signal";
}

static void on_fatal(int sig, siginfo_t *info, void *context) {
  (void)info, (void)context;
  if (__atomic_exchange_n(&crash_reporting, 1, __ATOMIC_SEQ_CST))
    for (;;) pause(); /* another thread reports and ends the process */
  const tsr_breadcrumb *b = tsr_breadcrumb_here();
  crash_line l = {.n = 0};
  put(&l, crash_prog);
  put(&l, ": ");
  if (b->rank >= 0) {
    put(&l, "rank ");
    put_int(&l, b->rank);
    put(&l, " crashed (");
    put(&l, signal_name(sig));
    put(&l, ")");
  } else {
    put(&l, "crashed (");
    put(&l, signal_name(sig));
    put(&l, ") outside the ranks");
  }
  bool in_rule = b->callback && same(b->callback, "op rule");
  if (b->plugin || b->callback) {
    put(&l, b->rank >= 0 ? " in " : ", in ");
    if (b->plugin) put(&l, "plugin ");
    put(&l, b->plugin);
    if (b->plugin && b->callback) put(&l, ", ");
    put(&l, b->callback);
    if (b->callback && b->name) put(&l, " ");
    put(&l, b->callback ? b->name : NULL);
    if (b->callback && b->phase) {
      put(&l, " (");
      put(&l, b->phase);
      put(&l, ")");
    }
  }
  if (b->op && !in_rule) {
    put(&l, b->plugin || b->callback ? ", during op " : " in op ");
    put(&l, b->op);
    if (b->op_pass) {
      put(&l, " (");
      put(&l, b->op_pass);
      put(&l, ")");
    }
  }
  if (b->step > 0) {
    put(&l, ", step ");
    put_int(&l, b->step);
  }
  if (b->microbatch >= 0) {
    put(&l, ", microbatch ");
    put_int(&l, b->microbatch);
  }
  l.buf[l.n++] = '\n';
  for (size_t done = 0; done < l.n;) {
    ssize_t w = write(STDERR_FILENO, l.buf + done, l.n - done);
    if (w <= 0) break;
    done += (size_t)w;
  }
  _exit(TSR_EXIT_RUNTIME);
}

void *tsr_app_crash_thread_begin(void) {
  stack_t ss = {.ss_sp = malloc(CRASH_STACK_BYTES), .ss_size = CRASH_STACK_BYTES, .ss_flags = 0};
  if (!ss.ss_sp) return NULL;
  if (sigaltstack(&ss, NULL) != 0) {
    free(ss.ss_sp);
    return NULL;
  }
  return ss.ss_sp;
}

void tsr_app_crash_thread_end(void *stack) {
  if (!stack) return;
  stack_t ss = {.ss_sp = NULL, .ss_size = 0, .ss_flags = SS_DISABLE};
  sigaltstack(&ss, NULL);
  free(stack);
}

void tsr_app_crash_install(const char *prog) {
  crash_prog = prog;
  (void)tsr_breadcrumb_here(); /* resolved now, not first inside the handler */
  /* the main thread's, kept for the process's life (held here, so it is not a leak) */
  static void *main_stack;
  if (!main_stack) main_stack = tsr_app_crash_thread_begin();
  struct sigaction sa;
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigfillset(&sa.sa_mask);
  static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
}
