/* pp: pipeline parallelism over the `pp` mesh dim.
 *
 * The model unbinds `pp` into stage meshes and holds each layer on its stage (models/llama); this
 * plugin owns the dim, checks the job against it and registers the schedules that order each
 * stage's forwards, backwards and transfers over the microbatches of a step. `tessera run` runs
 * the schedule named in [strategy.pp] schedule with [strategy.pp] microbatches.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pp_schedule.h"
#include "tessera/plugin.h"

static const char *const pp_dims[] = {"pp", NULL};

static const tsr_key_spec pp_keys[] = {
    {"schedule", TSR_KEY_STRING, "1f1b", 0, 0, NULL,
     "order of forwards and backwards over the microbatches of a step: gpipe, 1f1b, "
     "interleaved_1f1b, zero_bubble, or a schedule another loaded plugin registers"},
    {"microbatches", TSR_KEY_INT, "1", 1, 4096, NULL,
     "microbatches per step (per accumulation step); at most the rows of one"},
    {"stages_per_rank", TSR_KEY_INT, "1", 1, 64, NULL,
     "model chunks per rank (virtual stages of interleaved_1f1b): rank r holds stages r, r + pp, "
     "..."},
    {"layers_per_stage", TSR_KEY_INTS, "", -1000000, 1000000, NULL,
     "explicit layer count of each of the pp x stages_per_rank stages, in stage order; empty: as "
     "even as possible, earlier stages first"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

/* The stage layout keys against the model: one count per stage, each >= 1, summing to the
 * layers. */
static tsr_status check_layers(const tsr_config *c, const char *lps, int stages, int pp,
                               int64_t spr) {
  int64_t layers;
  TSR_CHECK(tsr_config_key_int(c, "model", "num_hidden_layers", &layers));
  if (layers < stages)
    return tsr_config_error(c, TSR_EINVAL, "model", "num_hidden_layers",
                            "%lld layers cannot fill %d pipeline stages (pp = %d x "
                            "stages_per_rank = %lld; every stage needs one); lower pp or "
                            "stages_per_rank, or raise num_hidden_layers",
                            (long long)layers, stages, pp, (long long)spr);
  if (!lps || !lps[0]) return TSR_OK;
  int count = 0;
  long long sum = 0;
  const char *at = lps;
  while (*at) {
    char *end = NULL;
    long long v = strtoll(at, &end, 10);
    if (end == at) break;
    if (v < 1)
      return tsr_config_error(c, TSR_EINVAL, "strategy.pp", "layers_per_stage",
                              "layers_per_stage = %s gives stage %d %lld layers; every stage "
                              "needs at least 1 (write one count >= 1 per stage)",
                              lps, count, v);
    sum += v;
    count++;
    at = end;
    while (*at == ',' || *at == ' ' || *at == '\t') at++;
  }
  if (count != stages)
    return tsr_config_error(c, TSR_EINVAL, "strategy.pp", "layers_per_stage",
                            "layers_per_stage = %s has %d counts for %d stages (pp = %d x "
                            "stages_per_rank = %lld); give one count per stage",
                            lps, count, stages, pp, (long long)spr);
  if (sum != layers)
    return tsr_config_error(c, TSR_EINVAL, "strategy.pp", "layers_per_stage",
                            "layers_per_stage = %s sums to %lld but [model] num_hidden_layers "
                            "= %lld; make the counts add up to the layers",
                            lps, sum, (long long)layers);
  return TSR_OK;
}

static tsr_status pp_validate(const tsr_plugin_args *args) {
  const tsr_config *c = args->config;
  const char *sec = "strategy.pp";
  int pp = tsr_config_mesh_size(c, "pp");
  int64_t mb = 1, spr = 1;
  TSR_CHECK(tsr_config_get_int(c, args->name, pp_keys, "microbatches", &mb));
  TSR_CHECK(tsr_config_get_int(c, args->name, pp_keys, "stages_per_rank", &spr));
  const char *sched = tsr_config_get(c, args->name, pp_keys, "schedule");
  const char *lps = tsr_config_get(c, args->name, pp_keys, "layers_per_stage");
  bool interleaved = strcmp(sched, "interleaved_1f1b") == 0;
  if (interleaved && spr < 2)
    return tsr_config_error(c, TSR_EINVAL, sec, "stages_per_rank",
                            "interleaved_1f1b needs stages_per_rank >= 2 (model chunks per "
                            "rank), got %lld; set stages_per_rank = 2 or more, or use 1f1b",
                            (long long)spr);
  if (!interleaved && spr != 1)
    return tsr_config_error(c, TSR_EINVAL, sec, "stages_per_rank",
                            "%lld model chunks per rank need schedule = interleaved_1f1b (%s "
                            "runs one chunk per rank); use 1 or that schedule",
                            (long long)spr, sched);
  if (interleaved && mb % pp)
    return tsr_config_error(c, TSR_EINVAL, sec, "microbatches",
                            "interleaved_1f1b needs microbatches %% pp == 0, got %lld over pp = "
                            "%d; use a multiple of %d",
                            (long long)mb, pp, pp);
  if (pp <= 1) return TSR_OK;
  TSR_CHECK(check_layers(c, lps, pp * (int)spr, pp, spr));
  int64_t accum, batch;
  TSR_CHECK(tsr_config_key_int(c, "optimizer", "grad_accum_steps", &accum));
  TSR_CHECK(tsr_config_key_int(c, "data", "batch_size", &batch));
  int64_t rows = batch / (accum > 0 ? accum : 1);
  if (mb > rows)
    return tsr_config_error(c, TSR_EINVAL, sec, "microbatches",
                            "%lld microbatches but a step has %lld rows ([data] batch_size / "
                            "[optimizer] grad_accum_steps); use at most %lld",
                            (long long)mb, (long long)rows, (long long)rows);
  return TSR_OK;
}

static tsr_status pp_init(const tsr_plugin_args *args, void **state) {
  (void)args;
  *state = NULL;
  return TSR_OK;
}

static void pp_fini(void *state) {
  (void)state;
}

static tsr_status pp_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  (void)state;
  int64_t spr = 1;
  TSR_CHECK(tsr_config_get_int(args->config, args->name, pp_keys, "stages_per_rank", &spr));
  /* the interleaved builder learns the chunk count from its ctx: no state to outlive */
  tsr_schedule scheds[4] = {
      {"gpipe", args->name, tsr_pp_gpipe, NULL},
      {"1f1b", args->name, tsr_pp_1f1b, NULL},
      {"interleaved_1f1b", args->name, tsr_pp_interleaved, (void *)(intptr_t)spr},
      {"zero_bubble", args->name, tsr_pp_zero_bubble, NULL},
  };
  for (int i = 0; i < 4; i++) TSR_CHECK(tsr_registry_add_schedule(reg, &scheds[i]));
  /* the model's layers are split into stages over the dim this plugin owns */
  return tsr_registry_set_stage_dim(reg, args->name, pp_dims[0]);
}

/* The schedule the job names must be one some loaded plugin registered: known only now, after
 * every plugin has registered, so a third party's schedule is as selectable as ours. */
static tsr_status pp_check_registry(const tsr_registry_t *reg, const tsr_plugin_args *args,
                                    void *state) {
  (void)state;
  const char *want = tsr_config_get(args->config, args->name, pp_keys, "schedule");
  if (tsr_registry_find_schedule(reg, want)) return TSR_OK;
  char names[512] = "";
  size_t o = 0;
  for (int i = 0; i < tsr_registry_schedule_count(reg) && o < sizeof names; i++) {
    const tsr_schedule *sc = tsr_registry_schedule_at(reg, i);
    o += (size_t)snprintf(names + o, sizeof names - o, "%s%s (%s)", i ? ", " : "", sc->name,
                          sc->owner ? sc->owner : "?");
  }
  char section[64];
  snprintf(section, sizeof section, "strategy.%s", args->name);
  return tsr_config_error(args->config, TSR_EINVAL, section, "schedule",
                          "no loaded plugin registers a pipeline schedule '%s'; the registered "
                          "schedules are: %s",
                          want, names);
}

static const tsr_strategy pp_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = "pp",
    .version = "0.1.0",
    .description =
        "pipeline parallelism: layers on unbind(pp) stages; gpipe, 1f1b, interleaved_1f1b and "
        "zero_bubble schedules",
    .dims = pp_dims,
    .keys = pp_keys,
    .validate = pp_validate,
    .init = pp_init,
    .fini = pp_fini,
    .register_rules = pp_register,
    .check_registry = pp_check_registry,
};

TSR_PLUGIN_DEFINE(pp_desc);
