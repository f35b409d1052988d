/* Registries beyond redistribute transitions: op sharding rules, module styles, pipeline
 * schedules, optimizer hooks and gradient hooks. They live behind tsr_registry_t.rules (see
 * registry_impl.h), made on first use so that a registry nobody adds rules to costs nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry_impl.h"
#include "tessera/breadcrumb.h"
#include "tessera/mesh.h"
#include "vocab_impl.h"

typedef struct rule_tables {
  tsr_vec ops;                         /* tsr_op_rule */
  tsr_vec styles;                      /* tsr_module_style */
  tsr_vec scheds;                      /* tsr_schedule */
  tsr_vec hooks;                       /* tsr_optim_hook */
  tsr_vec grad_hooks;                  /* tsr_grad_hook */
  tsr_vec rank_states;                 /* tsr_rank_state_spec */
  const char *stage_dim, *stage_owner; /* tsr_registry_set_stage_dim; NULL until set */
} rule_tables;

static tsr_status tables_of(tsr_registry_t *reg, rule_tables **out) {
  if (!reg) return TSR_ERROR(TSR_EINVAL, "registry is NULL");
  if (!reg->rules) {
    reg->rules = calloc(1, sizeof(rule_tables));
    if (!reg->rules) return TSR_ERROR(TSR_ENOMEM, "out of memory allocating registry tables");
  }
  *out = reg->rules;
  return TSR_OK;
}

static const tsr_vec *vec_of(const tsr_registry_t *reg, size_t member) {
  if (!reg || !reg->rules) return NULL;
  return (const tsr_vec *)((const char *)reg->rules + member);
}

static int vec_count(const tsr_registry_t *reg, size_t member) {
  const tsr_vec *v = vec_of(reg, member);
  return v ? v->count : 0;
}

static const void *vec_at(const tsr_registry_t *reg, size_t member, int i, size_t size) {
  const tsr_vec *v = vec_of(reg, member);
  if (!v || i < 0 || i >= v->count) return NULL;
  return (const char *)v->items + (size_t)i * size;
}

void tsr_registry_rules_free(tsr_registry_t *reg) {
  rule_tables *t = reg ? reg->rules : NULL;
  if (!t) return;
  tsr_vec_free(&t->ops);
  tsr_vec_free(&t->styles);
  tsr_vec_free(&t->scheds);
  tsr_vec_free(&t->hooks);
  tsr_vec_free(&t->grad_hooks);
  tsr_vec_free(&t->rank_states);
  free(t);
  reg->rules = NULL;
}

static bool same_dim(const char *a, const char *b) {
  if (!a || !b) return a == b;
  return !strcmp(tsr_mesh_canonical_name(a), tsr_mesh_canonical_name(b));
}

static const char *placements_str(int n, const tsr_placement *p, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && o < len; i++) {
    char one[32];
    o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "",
                          tsr_placement_str(p[i], one, sizeof one));
  }
  return buf;
}

/* ---- Op rules ---- */

static bool op_inputs_match(const tsr_op_rule *r, int n, const tsr_placement *in) {
  if (r->ninputs != n) return false;
  for (int i = 0; i < n; i++)
    if (!(r->any_input & (1u << i)) && !tsr_placement_equal(r->inputs[i], in[i])) return false;
  return true;
}

tsr_status tsr_registry_add_op_rule(tsr_registry_t *reg, const tsr_op_rule *rule) {
  if (!rule || !rule->name || !rule->op)
    return TSR_ERROR(TSR_EINVAL, "op rule '%s' needs a name and an op",
                     rule && rule->name ? rule->name : "(unnamed)");
  const tsr_vocab_op *op = tsr_vocab_find_op(rule->op);
  char names[256];
  if (!op)
    return TSR_ERROR(TSR_EINVAL,
                     "op rule '%s' is for op '%s', which the model never calls; the ops with "
                     "sharding rules are: %s",
                     rule->name, rule->op, tsr_vocab_join(tsr_op_names(), names, sizeof names));
  if (rule->ninputs != op->ninputs)
    return TSR_ERROR(TSR_EINVAL,
                     "op rule '%s': %s takes %d inputs (%s) but the rule has ninputs = %d; "
                     "give one placement per input",
                     rule->name, op->name, op->ninputs, op->inputs, rule->ninputs);
  if (rule->use_mask & ~op->params)
    return TSR_ERROR(TSR_EINVAL,
                     "op rule '%s' gathers inputs (use_mask 0x%x) of %s (%s) that are not "
                     "parameters; use_mask may only mark the weight of embedding, rmsnorm or "
                     "linear (bit 1) or the expert weights of moe_experts (bits 2, 3): "
                     "activations are redistributed by module styles",
                     rule->name, rule->use_mask, op->name, op->inputs);
  /* the op's arity bounds ninputs and its parameters bound use_mask; the outputs are the rule's */
  if (rule->noutputs < 1 || rule->noutputs > TSR_MAX_OP_OUTPUTS)
    return TSR_ERROR(TSR_EINVAL, "op rule '%s': %d outputs; allowed 1..%d", rule->name,
                     rule->noutputs, TSR_MAX_OP_OUTPUTS);
  if (rule->compute && !rule->backward)
    return TSR_ERROR(TSR_EINVAL,
                     "op rule '%s' has a compute function but no backward; a rule "
                     "that computes must also differentiate",
                     rule->name);
  if (rule->use_mask && rule->compute)
    return TSR_ERROR(TSR_EINVAL,
                     "op rule '%s' redistributes inputs (use_mask 0x%x) and has a compute "
                     "function; a rule that moves inputs lets the op run as planned on the moved "
                     "ones",
                     rule->name, rule->use_mask);
  rule_tables *t = NULL;
  TSR_CHECK(tables_of(reg, &t));
  for (int i = 0; i < t->ops.count; i++) {
    const tsr_op_rule *o = &((const tsr_op_rule *)t->ops.items)[i];
    if (!strcmp(o->op, rule->op) && same_dim(o->mesh_dim, rule->mesh_dim) &&
        o->any_input == rule->any_input && op_inputs_match(o, rule->ninputs, rule->inputs)) {
      char buf[128];
      return TSR_ERROR(TSR_EINVAL,
                       "op rule '%s' for %s on dim %s with inputs (%s) duplicates rule '%s'",
                       rule->name, rule->op, rule->mesh_dim ? rule->mesh_dim : "(any)",
                       placements_str(rule->ninputs, rule->inputs, buf, sizeof buf), o->name);
    }
  }
  return tsr_vec_push(&t->ops, rule, sizeof *rule);
}

const tsr_op_rule *tsr_registry_find_op_rule(const tsr_registry_t *reg, const char *op,
                                             const char *mesh_dim, int ninputs,
                                             const tsr_placement *inputs) {
  const tsr_vec *v = vec_of(reg, offsetof(rule_tables, ops));
  if (!v || !op) return NULL;
  const tsr_op_rule *any_dim = NULL;
  for (int i = v->count - 1; i >= 0; i--) {
    const tsr_op_rule *r = &((const tsr_op_rule *)v->items)[i];
    if (strcmp(r->op, op) || !op_inputs_match(r, ninputs, inputs)) continue;
    if (r->mesh_dim == NULL) {
      if (!any_dim) any_dim = r;
    } else if (mesh_dim && same_dim(r->mesh_dim, mesh_dim)) {
      return r;
    }
  }
  return any_dim;
}

int tsr_registry_op_rule_count(const tsr_registry_t *reg) {
  return vec_count(reg, offsetof(rule_tables, ops));
}

const tsr_op_rule *tsr_registry_op_rule_at(const tsr_registry_t *reg, int i) {
  return vec_at(reg, offsetof(rule_tables, ops), i, sizeof(tsr_op_rule));
}

void tsr_registry_note_op_rule(const tsr_registry_t *reg, const tsr_op_rule *rule) {
  tsr_vec_note_item(vec_of(reg, offsetof(rule_tables, ops)), rule, sizeof *rule);
}

int64_t tsr_registry_op_rule_uses(const tsr_registry_t *reg, int i) {
  return tsr_vec_uses(vec_of(reg, offsetof(rule_tables, ops)), i);
}

const char *tsr_registry_op_rule_owner(const tsr_registry_t *reg, const tsr_op_rule *rule) {
  return tsr_vec_owner_of(vec_of(reg, offsetof(rule_tables, ops)), rule, sizeof *rule);
}

/* ---- Module styles ---- */

tsr_status tsr_registry_add_module_style(tsr_registry_t *reg, const tsr_module_style *style) {
  if (!style || !style->style || !style->mesh_dim)
    return TSR_ERROR(TSR_EINVAL, "module style needs a style name and a mesh dim (got %s on %s)",
                     style && style->style ? style->style : "(none)",
                     style && style->mesh_dim ? style->mesh_dim : "(none)");
  if (style->nparams < 0 || style->nparams > TSR_MAX_STYLE_PARAMS)
    return TSR_ERROR(TSR_EINVAL, "module style %s on %s: %d parameters; at most %d", style->style,
                     style->mesh_dim, style->nparams, TSR_MAX_STYLE_PARAMS);
  if (!tsr_vocab_has_style(style->style)) {
    char names[256];
    return TSR_ERROR(TSR_EINVAL,
                     "module style '%s' on dim %s (by %s) is not a module the model has; the "
                     "module styles are: %s",
                     style->style, style->mesh_dim, style->owner ? style->owner : "(unknown)",
                     tsr_vocab_join(tsr_module_style_names(), names, sizeof names));
  }
  for (int i = 0; i < style->nparams; i++) {
    if (!style->params[i].name)
      return TSR_ERROR(TSR_EINVAL, "module style %s on %s: parameter %d has no name", style->style,
                       style->mesh_dim, i);
    if (strcmp(style->params[i].name, "weight"))
      return TSR_ERROR(TSR_EINVAL,
                       "module style %s on %s: the module has no parameter '%s'; its one "
                       "parameter is 'weight'",
                       style->style, style->mesh_dim, style->params[i].name);
  }
  const tsr_module_style *old = tsr_registry_find_module_style(reg, style->style, style->mesh_dim);
  if (old)
    return TSR_ERROR(TSR_EINVAL,
                     "module style %s on dim %s is registered by %s and again by %s; one strategy "
                     "owns a dim's styles",
                     style->style, style->mesh_dim, old->owner ? old->owner : "(unknown)",
                     style->owner ? style->owner : "(unknown)");
  rule_tables *t = NULL;
  TSR_CHECK(tables_of(reg, &t));
  return tsr_vec_push(&t->styles, style, sizeof *style);
}

tsr_status tsr_registry_add_data_split(tsr_registry_t *reg, const char *owner, const char *mesh_dim,
                                       tsr_placement split) {
  if (split.kind != TSR_SHARD || (split.dim != 0 && split.dim != 1)) {
    char one[32];
    return TSR_ERROR(TSR_EINVAL,
                     "%s: data split %s on dim %s; the data splits by Shard(0) (the batch) or "
                     "Shard(1) (the sequence)",
                     owner ? owner : "(unknown)", tsr_placement_str(split, one, sizeof one),
                     mesh_dim ? mesh_dim : "(none)");
  }
  tsr_module_style style = {.style = TSR_STYLE_EMBEDDING,
                            .mesh_dim = mesh_dim,
                            .owner = owner,
                            .nparams = 1,
                            .params = {{"weight", tsr_replicate()}},
                            .input = split,
                            .output = split};
  return tsr_registry_add_module_style(reg, &style);
}

const tsr_module_style *tsr_registry_find_module_style(const tsr_registry_t *reg, const char *style,
                                                       const char *mesh_dim) {
  const tsr_vec *v = vec_of(reg, offsetof(rule_tables, styles));
  if (!v || !style || !mesh_dim) return NULL;
  for (int i = 0; i < v->count; i++) {
    const tsr_module_style *s = &((const tsr_module_style *)v->items)[i];
    if (!strcmp(s->style, style) && same_dim(s->mesh_dim, mesh_dim)) return s;
  }
  return NULL;
}

tsr_placement tsr_module_style_param(const tsr_module_style *s, const char *param) {
  for (int i = 0; s && i < s->nparams; i++)
    if (!strcmp(s->params[i].name, param)) return s->params[i].placement;
  return tsr_replicate();
}

int tsr_registry_module_style_count(const tsr_registry_t *reg) {
  return vec_count(reg, offsetof(rule_tables, styles));
}

const tsr_module_style *tsr_registry_module_style_at(const tsr_registry_t *reg, int i) {
  return vec_at(reg, offsetof(rule_tables, styles), i, sizeof(tsr_module_style));
}

/* ---- Schedules ---- */

tsr_status tsr_registry_add_schedule(tsr_registry_t *reg, const tsr_schedule *sched) {
  if (!sched || !sched->name || !sched->build)
    return TSR_ERROR(TSR_EINVAL, "schedule '%s' needs a name and a build function",
                     sched && sched->name ? sched->name : "(unnamed)");
  const tsr_schedule *old = tsr_registry_find_schedule(reg, sched->name);
  if (old)
    return TSR_ERROR(TSR_EINVAL, "schedule '%s' is registered by %s and again by %s", sched->name,
                     old->owner ? old->owner : "(unknown)",
                     sched->owner ? sched->owner : "(unknown)");
  rule_tables *t = NULL;
  TSR_CHECK(tables_of(reg, &t));
  return tsr_vec_push(&t->scheds, sched, sizeof *sched);
}

const tsr_schedule *tsr_registry_find_schedule(const tsr_registry_t *reg, const char *name) {
  const tsr_vec *v = vec_of(reg, offsetof(rule_tables, scheds));
  if (!v || !name) return NULL;
  for (int i = 0; i < v->count; i++) {
    const tsr_schedule *s = &((const tsr_schedule *)v->items)[i];
    if (!strcmp(s->name, name)) return s;
  }
  return NULL;
}

int tsr_registry_schedule_count(const tsr_registry_t *reg) {
  return vec_count(reg, offsetof(rule_tables, scheds));
}

const tsr_schedule *tsr_registry_schedule_at(const tsr_registry_t *reg, int i) {
  return vec_at(reg, offsetof(rule_tables, scheds), i, sizeof(tsr_schedule));
}

/* ---- Optimizer hooks ---- */

tsr_status tsr_registry_add_optim_hook(tsr_registry_t *reg, const tsr_optim_hook *hook) {
  if (!hook || !hook->name || !hook->fn)
    return TSR_ERROR(TSR_EINVAL, "optimizer hook '%s' needs a name and a function",
                     hook && hook->name ? hook->name : "(unnamed)");
  if (hook->when != TSR_HOOK_BEFORE_STEP && hook->when != TSR_HOOK_AFTER_STEP)
    return TSR_ERROR(TSR_EINVAL, "optimizer hook '%s': when = %d is neither before nor after",
                     hook->name, (int)hook->when);
  rule_tables *t = NULL;
  TSR_CHECK(tables_of(reg, &t));
  return tsr_vec_push(&t->hooks, hook, sizeof *hook);
}

tsr_status tsr_registry_run_optim_hooks(const tsr_registry_t *reg, tsr_rank_t *r,
                                        tsr_hook_when when, const tsr_optim_step *step) {
  const tsr_vec *v = vec_of(reg, offsetof(rule_tables, hooks));
  if (!v) return TSR_OK;
  const tsr_optim_hook *hooks = v->items;
  for (int k = 0; k < v->count; k++) {
    int i = when == TSR_HOOK_BEFORE_STEP ? k : v->count - 1 - k;
    if (hooks[i].when != when) continue;
    tsr_breadcrumb_saved crumb =
        tsr_breadcrumb_enter(tsr_vec_owner(v, i), "optimizer hook", hooks[i].name,
                             when == TSR_HOOK_BEFORE_STEP ? "before step" : "after step");
    tsr_status st = hooks[i].fn(r, when, step, hooks[i].ctx);
    tsr_breadcrumb_leave(&crumb);
    if (st != TSR_OK)
      return tsr_error_prefix(st, "optimizer hook %s (%s step %lld)", hooks[i].name,
                              when == TSR_HOOK_BEFORE_STEP ? "before" : "after",
                              step ? (long long)step->step : 0LL);
  }
  return TSR_OK;
}

int tsr_registry_optim_hook_count(const tsr_registry_t *reg) {
  return vec_count(reg, offsetof(rule_tables, hooks));
}

/* ---- Gradient hooks ---- */

tsr_status tsr_registry_add_grad_hook(tsr_registry_t *reg, const tsr_grad_hook *hook) {
  if (!hook || !hook->name || !hook->ready)
    return TSR_ERROR(TSR_EINVAL, "gradient hook '%s' needs a name and a ready function",
                     hook && hook->name ? hook->name : "(unnamed)");
  rule_tables *t = NULL;
  TSR_CHECK(tables_of(reg, &t));
  return tsr_vec_push(&t->grad_hooks, hook, sizeof *hook);
}

int tsr_registry_grad_hook_count(const tsr_registry_t *reg) {
  return vec_count(reg, offsetof(rule_tables, grad_hooks));
}

const tsr_grad_hook *tsr_registry_grad_hook_at(const tsr_registry_t *reg, int i) {
  return vec_at(reg, offsetof(rule_tables, grad_hooks), i, sizeof(tsr_grad_hook));
}

const char *tsr_registry_grad_hook_owner(const tsr_registry_t *reg, int i) {
  return tsr_vec_owner(vec_of(reg, offsetof(rule_tables, grad_hooks)), i);
}

/* ---- Pipeline stages ---- */

tsr_status tsr_registry_set_stage_dim(tsr_registry_t *reg, const char *owner,
                                      const char *mesh_dim) {
  if (!mesh_dim || !mesh_dim[0])
    return TSR_ERROR(TSR_EINVAL, "%s: the pipeline stage dim needs a mesh dim name",
                     owner ? owner : "(unknown)");
  rule_tables *t = NULL;
  TSR_CHECK(tables_of(reg, &t));
  if (t->stage_dim && !same_dim(t->stage_dim, mesh_dim))
    return TSR_ERROR(TSR_EINVAL,
                     "%s declares mesh dim '%s' the pipeline stage dim, but %s declared '%s'; a "
                     "model is split into stages over one dim",
                     owner ? owner : "(unknown)", mesh_dim,
                     t->stage_owner ? t->stage_owner : "(unknown)", t->stage_dim);
  t->stage_dim = mesh_dim;
  t->stage_owner = owner;
  return TSR_OK;
}

const char *tsr_registry_stage_dim(const tsr_registry_t *reg) {
  const rule_tables *t = reg ? reg->rules : NULL;
  return t ? t->stage_dim : NULL;
}

/* ---- Per-rank state ---- */

tsr_status tsr_registry_add_rank_state(tsr_registry_t *reg, const tsr_rank_state_spec *spec) {
  if (!spec || !spec->name || !spec->setup)
    return TSR_ERROR(TSR_EINVAL, "rank state '%s' needs a name and a setup function",
                     spec && spec->name ? spec->name : "(unnamed)");
  rule_tables *t = NULL;
  TSR_CHECK(tables_of(reg, &t));
  for (int i = 0; i < t->rank_states.count; i++)
    if (!strcmp(((const tsr_rank_state_spec *)t->rank_states.items)[i].name, spec->name))
      return TSR_ERROR(TSR_EINVAL, "rank state '%s' is registered twice; give each a unique name",
                       spec->name);
  return tsr_vec_push(&t->rank_states, spec, sizeof *spec);
}

int tsr_registry_rank_state_count(const tsr_registry_t *reg) {
  return vec_count(reg, offsetof(rule_tables, rank_states));
}

const tsr_rank_state_spec *tsr_registry_rank_state_at(const tsr_registry_t *reg, int i) {
  return vec_at(reg, offsetof(rule_tables, rank_states), i, sizeof(tsr_rank_state_spec));
}

const char *tsr_registry_rank_state_owner(const tsr_registry_t *reg, int i) {
  return tsr_vec_owner(vec_of(reg, offsetof(rule_tables, rank_states)), i);
}
