/* `tessera conform`, level L2: the pipeline schedules the plugin registers.
 *
 * A schedule is a pure function (stages, microbatches, stage) -> actions, so it is checked
 * without ranks: every stage's list is run against the others' and must forward, backward and
 * pass on each microbatch exactly once, in dependency order, without a deadlock.
 */
#include <stdio.h>
#include <string.h>

#include "conform.h"

#define L2_MAX_MB      6    /* microbatch counts tried: 1 .. L2_MAX_MB */
#define L2_MAX_ACTIONS 1024 /* per stage */
#define L2_MAX_CHUNKS  8    /* model chunks per rank (interleaved schedules) */

static const char *action_name(int k) {
  static const char *const names[] = {"forward",        "backward",       "send_act",
                                      "recv_act",       "send_grad",      "recv_grad",
                                      "backward_input", "backward_weight"};
  return k >= 0 && k < 8 ? names[k] : "unknown action";
}

/* Per (stage, chunk, microbatch): what has happened. */
typedef struct l2_pipe_state {
  bool fwd, bin, bw, got_act, got_grad, sent_act, sent_grad;
} l2_pipe_state;

/* Runs the stages' lists against each other. Rank s holds chunks 0..C-1, chunk c being virtual
 * stage c * S + s (the interleaved layout; C = 1 otherwise); activations go from virtual stage v
 * to v + 1 and gradients back. Sends never block, a receive waits for its send, and transfers
 * past either end of the pipeline are no-ops (the executor drops them). A backward is one
 * BACKWARD or a BACKWARD_INPUT followed by a BACKWARD_WEIGHT. False with a reason on a malformed
 * list or a deadlock. */
static bool simulate(int S, int M, tsr_pipe_action (*acts)[L2_MAX_ACTIONS], const int *nact,
                     char *msg, size_t len) {
  static l2_pipe_state st[4][L2_MAX_CHUNKS][L2_MAX_MB];
  memset(st, 0, sizeof st);
  int idx[4] = {0}, C = 1;
  for (int s = 0; s < S; s++)
    for (int i = 0; i < nact[s]; i++) {
      tsr_pipe_action a = acts[s][i];
      if (a.microbatch < 0 || a.microbatch >= M || a.chunk < 0 || a.chunk >= L2_MAX_CHUNKS) {
        snprintf(msg, len, "stage %d action %d (%s): microbatch %d or chunk %d out of range", s, i,
                 action_name((int)a.kind), a.microbatch, a.chunk);
        return false;
      }
      if (a.chunk + 1 > C) C = a.chunk + 1;
    }
  int V = S * C;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < S; s++)
      while (idx[s] < nact[s]) {
        tsr_pipe_action a = acts[s][idx[s]];
        int mb = a.microbatch, c = a.chunk, v = c * S + s;
        l2_pipe_state *x = &st[s][c][mb];
        l2_pipe_state *prev = v > 0 ? &st[(v - 1) % S][(v - 1) / S][mb] : NULL;
        l2_pipe_state *next = v < V - 1 ? &st[(v + 1) % S][(v + 1) / S][mb] : NULL;
        bool ok = true, ready = true;
        switch ((int)a.kind) {
          case TSR_PIPE_FORWARD:
            ok = !x->fwd && (!prev || x->got_act);
            x->fwd = true;
            break;
          case TSR_PIPE_BACKWARD:
            ok = x->fwd && !x->bin && !x->bw && (!next || x->got_grad);
            x->bin = x->bw = true;
            break;
          case TSR_PIPE_BACKWARD_INPUT:
            ok = x->fwd && !x->bin && (!next || x->got_grad);
            x->bin = true;
            break;
          case TSR_PIPE_BACKWARD_WEIGHT:
            ok = x->bin && !x->bw;
            x->bw = true;
            break;
          case TSR_PIPE_SEND_ACT:
            ok = x->fwd && !x->sent_act;
            x->sent_act = true;
            break;
          case TSR_PIPE_SEND_GRAD:
            ok = x->bin && !x->sent_grad;
            x->sent_grad = true;
            break;
          case TSR_PIPE_RECV_ACT:
            ok = !x->got_act;
            ready = !prev || prev->sent_act;
            if (ok && ready) x->got_act = true;
            break;
          case TSR_PIPE_RECV_GRAD:
            ok = !x->got_grad;
            ready = !next || next->sent_grad;
            if (ok && ready) x->got_grad = true;
            break;
          default:
            ok = false;
        }
        if (!ok) {
          snprintf(msg, len,
                   "stage %d of %d, action %d (%s of microbatch %d, chunk %d) is out of order, "
                   "repeated or unknown",
                   s, S, idx[s], action_name((int)a.kind), mb, c);
          return false;
        }
        if (!ready) break;
        idx[s]++;
        progress = true;
      }
  }
  for (int s = 0; s < S; s++) {
    if (idx[s] < nact[s]) {
      tsr_pipe_action a = acts[s][idx[s]];
      snprintf(msg, len,
               "deadlock: stage %d of %d waits at action %d (%s of microbatch %d, chunk %d) for "
               "a send that never comes",
               s, S, idx[s], action_name((int)a.kind), a.microbatch, a.chunk);
      return false;
    }
    for (int c = 0; c < C; c++)
      for (int mb = 0; mb < M; mb++) {
        const l2_pipe_state *x = &st[s][c][mb];
        int v = c * S + s;
        if (!x->fwd || !x->bin || !x->bw || (v < V - 1 && !x->sent_act) ||
            (v > 0 && !x->sent_grad)) {
          snprintf(msg, len,
                   "stage %d of %d never completes microbatch %d of chunk %d (forward, backward "
                   "and its sends)",
                   s, S, mb, c);
          return false;
        }
      }
  }
  return true;
}

static cf_result schedule_check(const tsr_schedule *sched, int stages, char *msg, size_t len) {
  static tsr_pipe_action acts[4][L2_MAX_ACTIONS];
  int nact[4], S = stages, ok = 0, refused = 0;
  char why[CF_MSG] = "";
  cf_result res = CF_PASS;
  for (int M = 1; M <= L2_MAX_MB && res == CF_PASS; M++) {
    tsr_status st = TSR_OK;
    for (int s = 0; s < S && st == TSR_OK; s++) {
      tsr_clear_error();
      st = sched->build(S, M, s, acts[s], L2_MAX_ACTIONS, &nact[s], sched->ctx);
      if (st == TSR_OK && (nact[s] < 0 || nact[s] > L2_MAX_ACTIONS))
        res = cf_say(msg, len, CF_FAIL, "%d stages, %d microbatches: stage %d reports %d actions",
                     S, M, s, nact[s]);
    }
    if (res != CF_PASS) break;
    if (st != TSR_OK) {
      if (st != TSR_EINVAL || !tsr_last_error()[0])
        res = cf_say(msg, len, CF_FAIL, "%d stages, %d microbatches: build returned %s%s%s", S, M,
                     tsr_status_name(st), tsr_last_error()[0] ? ": " : " without a message",
                     tsr_last_error());
      else if (!refused++)
        snprintf(why, sizeof why, "%d microbatches: %s", M, tsr_last_error());
      continue;
    }
    char m2[CF_MSG];
    if (!simulate(S, M, acts, nact, m2, sizeof m2))
      res = cf_say(msg, len, CF_FAIL, "%d microbatches: %s", M, m2);
    else
      ok++;
  }
  if (res != CF_PASS) return res;
  if (!ok)
    return cf_say(msg, len, CF_NOTSUP, "refuses every microbatch count 1-%d: %s", L2_MAX_MB, why);
  return cf_say(msg, len, CF_PASS, "%d microbatch counts consistent%s%s", ok,
                refused ? "; refused: " : "", why);
}

static cf_result sched_body(const cf_plugin *p, const cf_test *t, const void *found,
                            const tsr_registry_t *reg, char *msg, size_t len) {
  (void)p, (void)reg;
  return schedule_check(found, t->n, msg, len);
}

cf_result cf_schedule_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  return cf_over_variants(p, t, 1, sched_body, msg, len);
}
