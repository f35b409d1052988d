/* Dumps: f32 safetensors of a run's first step, and their comparison. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io_internal.h"

tsr_status tsr_dump_save(const char *path, int n, const char *const *names,
                         const tsr_tensor *const *tensors) {
  if (n < 0 || (n > 0 && (!names || !tensors)))
    return TSR_ERROR(TSR_EINVAL, "%s: bad dump tensor list (n = %d)", path, n);
  tsr_status s = TSR_OK;
  tsr_tensor **conv = calloc((size_t)n + 1, sizeof *conv);
  const tsr_tensor **out = calloc((size_t)n + 1, sizeof *out);
  if (!conv || !out) {
    s = TSR_ERROR(TSR_ENOMEM, "%s: out of memory preparing the dump", path);
    goto cleanup;
  }
  for (int i = 0; i < n; i++) {
    out[i] = tensors[i];
    if (!tensors[i] || tensors[i]->dtype == TSR_F32) continue; /* NULL is reported by save */
    s = tsr_tensor_cast(tensors[i], TSR_F32, &conv[i]);
    if (s != TSR_OK) {
      tsr_error_prefix(s, "%s: tensor '%s'", path, names[i] ? names[i] : "?");
      goto cleanup;
    }
    out[i] = conv[i];
  }
  const char *key = "format", *value = TSR_DUMP_FORMAT;
  s = tsr_safetensors_save(path, n, names, out, 1, &key, &value);
cleanup:
  for (int i = 0; conv && i < n; i++) tsr_tensor_free(conv[i]);
  free(conv);
  free(out);
  return s;
}

/* Appends a line to the report, keeping it terminated and never overrunning it. */
static void report_line(char *report, size_t len, const char *fmt, ...) {
  if (!report || len == 0) return;
  size_t used = strlen(report);
  if (used + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(report + used, len - used, fmt, ap);
  va_end(ap);
}

/* Compares one tensor present in both files; returns whether it is bad. */
static tsr_status compare_tensor(const tsr_safetensors_t *fa, const tsr_safetensors_t *fb,
                                 const char *name, double rtol, double atol, char *report,
                                 size_t len, bool *bad) {
  tsr_tensor *x = NULL, *y = NULL;
  tsr_status s = TSR_OK;
  char sa[160], sb[160];
  *bad = false;
  TSR_CHECK_GOTO(tsr_safetensors_read_as(fa, name, TSR_F32, &x), s);
  TSR_CHECK_GOTO(tsr_safetensors_read_as(fb, name, TSR_F32, &y), s);
  bool same = x->ndim == y->ndim;
  for (int d = 0; same && d < x->ndim; d++) same = x->shape[d] == y->shape[d];
  if (!same) {
    *bad = true;
    report_line(report, len, "%s: shape %s in %s, %s in %s\n", name,
                tsr_shape_str(x->ndim, x->shape, sa, sizeof sa), tsr_safetensors_path(fa),
                tsr_shape_str(y->ndim, y->shape, sb, sizeof sb), tsr_safetensors_path(fb));
    goto cleanup;
  }
  const float *px = tsr_tensor_data(x), *py = tsr_tensor_data(y);
  int64_t n = tsr_tensor_numel(x), nbad = 0, worst = -1;
  double worst_excess = -1;
  for (int64_t i = 0; i < n; i++) {
    double a = px[i], b = py[i];
    if (a == b) continue; /* equal infinities included */
    /* a non-finite value agrees only with the same one: an Inf in b must not make the
     * tolerance infinite, and a NaN agrees with a NaN at the same place */
    bool finite = isfinite(a) && isfinite(b);
    if (!finite && isnan(a) && isnan(b)) continue;
    double diff = fabs(a - b), tol = atol + rtol * fabs(b);
    if (finite && diff <= tol) continue;
    nbad++;
    double excess = finite ? diff - tol : INFINITY;
    if (worst < 0 || excess > worst_excess) {
      worst = i;
      worst_excess = excess;
    }
  }
  if (nbad) {
    *bad = true;
    int64_t idx[TSR_MAX_DIMS], rem = worst;
    for (int d = x->ndim - 1; d >= 0; d--) {
      idx[d] = x->shape[d] ? rem % x->shape[d] : 0;
      rem = x->shape[d] ? rem / x->shape[d] : 0;
    }
    double a = px[worst], b = py[worst];
    if (isfinite(a) && isfinite(b))
      report_line(report, len,
                  "%s: %lld of %lld elements differ; worst at %s: %.9g vs %.9g (|diff| "
                  "%.3g, tolerance %.3g)\n",
                  name, (long long)nbad, (long long)n, tsr_shape_str(x->ndim, idx, sa, sizeof sa),
                  a, b, fabs(a - b), atol + rtol * fabs(b));
    else
      report_line(report, len,
                  "%s: %lld of %lld elements differ; worst at %s: %.9g vs %.9g (a non-finite "
                  "value agrees only with the same value)\n",
                  name, (long long)nbad, (long long)n, tsr_shape_str(x->ndim, idx, sa, sizeof sa),
                  a, b);
  }
cleanup:
  tsr_tensor_free(x);
  tsr_tensor_free(y);
  return s;
}

tsr_status tsr_dump_compare(const char *a, const char *b, double rtol, double atol, char *report,
                            size_t report_len, int *nbad) {
  *nbad = 0;
  if (report && report_len) report[0] = '\0';
  tsr_safetensors_t *fa = NULL, *fb = NULL;
  tsr_status s = TSR_OK;
  TSR_CHECK_GOTO(tsr_safetensors_open(a, &fa), s);
  TSR_CHECK_GOTO(tsr_safetensors_open(b, &fb), s);
  for (int i = 0; i < tsr_safetensors_count(fa); i++) {
    const char *name = tsr_safetensors_name(fa, i);
    if (!tsr_safetensors_has(fb, name)) {
      (*nbad)++;
      report_line(report, report_len, "%s: in %s, missing from %s\n", name, a, b);
      continue;
    }
    bool bad;
    TSR_CHECK_GOTO(compare_tensor(fa, fb, name, rtol, atol, report, report_len, &bad), s);
    if (bad) (*nbad)++;
  }
  for (int i = 0; i < tsr_safetensors_count(fb); i++) {
    const char *name = tsr_safetensors_name(fb, i);
    if (tsr_safetensors_has(fa, name)) continue;
    (*nbad)++;
    report_line(report, report_len, "%s: in %s, missing from %s\n", name, b, a);
  }
cleanup:
  tsr_safetensors_close(fa);
  tsr_safetensors_close(fb);
  return s;
}
