/* Composition: a communicating rule hands an op on to the rule of another mesh dim (see
 * tsr_op_defer_forward in tessera/registry.h). */
#include <stdlib.h>

#include "registry_impl.h"
#include "tessera/breadcrumb.h"
#include "tessera/mesh.h"

struct tsr_op_deferral {
  const tsr_op_rule *rule; /* the other dim's rule */
  int dim;                 /* the mesh dim it runs for */
  void *saved;             /* what its compute saved for its backward */
  const char *owner;       /* the plugin that registered the rule, for the breadcrumb */
};

tsr_status tsr_op_defer_forward(tsr_rank_t *r, const char *op, int dim, int ninputs,
                                const tsr_dtensor *const *inputs, const void *attrs, int noutputs,
                                tsr_dtensor **outputs, tsr_op_deferral **out) {
  *out = NULL;
  const tsr_registry_t *reg = tsr_rank_registry(r);
  const tsr_mesh_t *m = inputs[0]->mesh;
  if (ninputs < 1 || ninputs > TSR_MAX_OP_INPUTS)
    return TSR_ERROR(TSR_EINVAL, "%s: %d inputs handed on; allowed 1..%d", op, ninputs,
                     TSR_MAX_OP_INPUTS);
  const tsr_op_rule *found = NULL;
  int found_dim = -1;
  for (int i = 0; reg && i < tsr_mesh_ndim(m); i++) {
    if (i == dim || tsr_mesh_dim_size(m, i) == 1) continue;
    tsr_placement in[TSR_MAX_OP_INPUTS];
    for (int j = 0; j < ninputs; j++) in[j] = inputs[j]->placements[i];
    const tsr_op_rule *rule =
        tsr_registry_find_op_rule(reg, op, tsr_mesh_dim_name(m, i), ninputs, in);
    if (!rule || !rule->compute) continue;
    if (found)
      return TSR_ERROR(TSR_ENOTSUP,
                       "%s handed on from mesh dim '%s': both '%s' (mesh dim '%s') and '%s' "
                       "(mesh dim '%s') communicate; one rule can take the call",
                       op, tsr_mesh_dim_name(m, dim), found->name, tsr_mesh_dim_name(m, found_dim),
                       rule->name, tsr_mesh_dim_name(m, i));
    found = rule;
    found_dim = i;
  }
  if (!found) return TSR_OK;
  tsr_op_deferral *d = calloc(1, sizeof *d);
  if (!d) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory handing the op on", op);
  d->rule = found;
  d->dim = found_dim;
  d->owner = tsr_registry_op_rule_owner(reg, found);
  tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(d->owner, "op rule", found->name, "forward");
  tsr_status st = found->compute(r, found_dim, ninputs, inputs, attrs, noutputs, outputs, &d->saved,
                                 found->ctx);
  tsr_breadcrumb_leave(&crumb);
  if (st != TSR_OK) {
    tsr_op_deferral_free(d);
    return tsr_error_prefix(st, "rule '%s' handed %s by mesh dim '%s'", found->name, op,
                            tsr_mesh_dim_name(m, dim));
  }
  *out = d;
  return TSR_OK;
}

tsr_status tsr_op_defer_backward(tsr_rank_t *r, const tsr_op_deferral *d, int ninputs,
                                 const tsr_dtensor *const *inputs, const void *attrs, int noutputs,
                                 const tsr_dtensor *const *outputs,
                                 const tsr_dtensor *const *grad_outputs,
                                 tsr_dtensor **grad_inputs) {
  if (!d) return TSR_ERROR(TSR_EINVAL, "no op was handed on: nothing to differentiate");
  tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(d->owner, "op rule", d->rule->name, "backward");
  tsr_status st = d->rule->backward(r, d->dim, ninputs, inputs, attrs, noutputs, outputs,
                                    grad_outputs, grad_inputs, d->saved, d->rule->ctx);
  tsr_breadcrumb_leave(&crumb);
  if (st != TSR_OK) return tsr_error_prefix(st, "rule '%s' (handed on)", d->rule->name);
  return TSR_OK;
}

const tsr_op_rule *tsr_op_deferral_rule(const tsr_op_deferral *d) {
  return d ? d->rule : NULL;
}

void tsr_op_deferral_free(tsr_op_deferral *d) {
  if (!d) return;
  if (d->saved) {
    if (d->rule->free_saved) {
      tsr_breadcrumb_saved crumb =
          tsr_breadcrumb_enter(d->owner, "op rule", d->rule->name, "free_saved");
      d->rule->free_saved(d->saved);
      tsr_breadcrumb_leave(&crumb);
    } else {
      free(d->saved);
    }
  }
  free(d);
}
