/* `tessera compare`: two dumps, tensor by tensor, with the worst errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "tessera/io.h"

static const char compare_usage[] =
    "usage: tessera compare A.safetensors B.safetensors [--rtol R] [--atol A]\n"
    "       tessera compare A.safetensors B.safetensors --rel-l2 X [--skip PREFIX]...\n"
    "\n"
    "Compares two dumps (or any safetensors files of float tensors) tensor by tensor: an element\n"
    "agrees when |a - b| <= atol + rtol * |b| (b from the second file); NaN and infinities agree\n"
    "only with the same value at the same place. Prints\n"
    "every tensor that disagrees with its worst element, then the largest absolute and relative\n"
    "errors over all tensors (relative ones where |b| >= 10 atol). Defaults: rtol 1e-4, atol "
    "1e-5.\n"
    "\n"
    "With --rel-l2 a tensor agrees when ||a - b|| <= X ||b|| (2-norms over the tensor), the test\n"
    "for low-precision runs, where single elements move by a rounding step of bf16; every tensor\n"
    "of B must be in A; non-finite elements must be the same in both and are left out of the\n"
    "norms. --skip leaves out the tensors whose names start with PREFIX.\n"
    "\n"
    "exit codes: 0 every tensor agrees, 1 some tensor differs, 2 bad arguments or unreadable "
    "file\n";

typedef struct worst {
  double abs_err, rel_err;
  char abs_name[256], rel_name[256];
} worst;

/* The largest |a - b| and |a - b| / |b| over tensors present in both files with one shape. */
static tsr_status worst_errors(const char *pa, const char *pb, double floor, worst *w) {
  tsr_safetensors_t *a = NULL, *b = NULL;
  tsr_status st = TSR_OK;
  memset(w, 0, sizeof *w);
  TSR_CHECK_GOTO(tsr_safetensors_open(pa, &a), st);
  TSR_CHECK_GOTO(tsr_safetensors_open(pb, &b), st);
  for (int i = 0; i < tsr_safetensors_count(a); i++) {
    const char *name = tsr_safetensors_name(a, i);
    if (!tsr_safetensors_has(b, name)) continue;
    tsr_tensor *x = NULL, *y = NULL;
    if (tsr_safetensors_read_as(a, name, TSR_F32, &x) != TSR_OK ||
        tsr_safetensors_read_as(b, name, TSR_F32, &y) != TSR_OK ||
        tsr_tensor_numel(x) != tsr_tensor_numel(y)) {
      tsr_tensor_free(x);
      tsr_tensor_free(y);
      tsr_clear_error();
      continue;
    }
    const float *px = tsr_tensor_data(x), *py = tsr_tensor_data(y);
    for (int64_t k = 0; k < tsr_tensor_numel(x); k++) {
      /* non-finite elements are reported by the comparison itself */
      if (!isfinite(px[k]) || !isfinite(py[k])) continue;
      double d = fabs((double)px[k] - py[k]);
      double r = py[k] != 0 ? d / fabs((double)py[k]) : (d > 0 ? INFINITY : 0);
      if (d > w->abs_err) w->abs_err = d, snprintf(w->abs_name, sizeof w->abs_name, "%s", name);
      /* Relative error of elements near zero says little: atol covers those. */
      if (fabs((double)py[k]) >= floor && r > w->rel_err)
        w->rel_err = r, snprintf(w->rel_name, sizeof w->rel_name, "%s", name);
    }
    tsr_tensor_free(x);
    tsr_tensor_free(y);
  }
cleanup:
  tsr_safetensors_close(a);
  tsr_safetensors_close(b);
  return st;
}

static bool skipped(const char *name, const char *const *skip, int nskip) {
  for (int i = 0; i < nskip; i++)
    if (!strncmp(name, skip[i], strlen(skip[i]))) return true;
  return false;
}

/* --rel-l2: every tensor of b (but the skipped ones) against a's, by 2-norms in double. */
static int compare_rel_l2(const char *pa, const char *pb, double tol, const char *const *skip,
                          int nskip) {
  tsr_safetensors_t *a = NULL, *b = NULL;
  tsr_status st = TSR_OK;
  int nbad = 0, nseen = 0;
  double max_err = 0;
  char max_name[256] = "-";
  TSR_CHECK_GOTO(tsr_safetensors_open(pa, &a), st);
  TSR_CHECK_GOTO(tsr_safetensors_open(pb, &b), st);
  for (int i = 0; i < tsr_safetensors_count(b); i++) {
    const char *name = tsr_safetensors_name(b, i);
    if (skipped(name, skip, nskip)) continue;
    nseen++;
    tsr_tensor *x = NULL, *y = NULL;
    if (!tsr_safetensors_has(a, name)) {
      printf("%s: missing from %s\n", name, pa);
      nbad++;
      continue;
    }
    TSR_CHECK_GOTO(tsr_safetensors_read_as(b, name, TSR_F32, &y), st);
    st = tsr_safetensors_read_as(a, name, TSR_F32, &x);
    if (st == TSR_OK && tsr_tensor_numel(x) != tsr_tensor_numel(y)) {
      printf("%s: %lld elements in %s, %lld in %s\n", name, (long long)tsr_tensor_numel(x), pa,
             (long long)tsr_tensor_numel(y), pb);
      nbad++;
    } else if (st == TSR_OK) {
      const float *px = tsr_tensor_data(x), *py = tsr_tensor_data(y);
      double diff = 0, norm = 0;
      int64_t nonfinite_bad = 0, first = -1;
      for (int64_t k = 0; k < tsr_tensor_numel(y); k++) {
        /* a NaN or an infinity agrees only with the same value at the same place, and stays
         * out of the norms (an Inf in b would make any error relatively small) */
        if (!isfinite(px[k]) || !isfinite(py[k])) {
          if (px[k] == py[k] || (isnan(px[k]) && isnan(py[k]))) continue;
          if (first < 0) first = k;
          nonfinite_bad++;
          continue;
        }
        double d = (double)px[k] - py[k];
        diff += d * d;
        norm += (double)py[k] * py[k];
      }
      diff = sqrt(diff), norm = sqrt(norm);
      double r = norm > 0 ? diff / norm : (diff > 0 ? INFINITY : 0);
      if (nonfinite_bad) {
        printf("%s: %lld non-finite element%s not matched; first at index %lld: %g vs %g\n", name,
               (long long)nonfinite_bad, nonfinite_bad == 1 ? "" : "s", (long long)first,
               (double)px[first], (double)py[first]);
        nbad++;
        r = INFINITY;
      } else if (!(diff <= tol * norm)) {
        printf("%s: relative L2 error %.3g > %g\n", name, r, tol);
        nbad++;
      }
      if (r > max_err) max_err = r, snprintf(max_name, sizeof max_name, "%s", name);
    }
    tsr_tensor_free(x);
    tsr_tensor_free(y);
    if (st != TSR_OK) goto cleanup;
  }
cleanup:
  tsr_safetensors_close(a);
  tsr_safetensors_close(b);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera compare: %s\n", tsr_last_error());
    return TSR_EXIT_BAD_INPUT;
  }
  printf("max relative L2 err %.3g (%s) over %d tensors\n", max_err, max_name, nseen);
  printf("%s: %d tensor%s differ%s at relative L2 %g\n", nbad ? "DIFFER" : "MATCH", nbad,
         nbad == 1 ? "" : "s", nbad == 1 ? "s" : "", tol);
  return nbad ? TSR_EXIT_RUNTIME : TSR_EXIT_OK;
}

int tsr_cmd_compare(int argc, char **argv) {
  if (tsr_app_wants_help(argc, argv)) {
    fputs(compare_usage, stdout);
    return TSR_EXIT_OK;
  }
  const char *files[2] = {NULL, NULL};
  int nfiles = 0;
  double tol[3] = {1e-4, 1e-5, -1}; /* rtol, atol, rel-l2 (< 0: elementwise) */
  const char *skip[16];
  int nskip = 0;
  for (int i = 1; i < argc; i++) {
    int which = !strcmp(argv[i], "--rtol")     ? 0
                : !strcmp(argv[i], "--atol")   ? 1
                : !strcmp(argv[i], "--rel-l2") ? 2
                                               : -1;
    if (which >= 0) {
      char *end = NULL;
      if (i + 1 < argc) tol[which] = strtod(argv[i + 1], &end);
      if (i + 1 >= argc || *end || !(tol[which] >= 0)) {
        fprintf(stderr, "tessera compare: %s needs a number >= 0\n%s", argv[i], compare_usage);
        return TSR_EXIT_BAD_INPUT;
      }
      i++;
    } else if (!strcmp(argv[i], "--skip")) {
      if (i + 1 >= argc || nskip == (int)(sizeof skip / sizeof skip[0])) {
        fprintf(stderr, "tessera compare: --skip needs a name prefix (at most %d)\n%s",
                (int)(sizeof skip / sizeof skip[0]), compare_usage);
        return TSR_EXIT_BAD_INPUT;
      }
      skip[nskip++] = argv[++i];
    } else if (argv[i][0] == '-' || nfiles == 2) {
      fprintf(stderr, "tessera compare: unexpected argument '%s'\n%s", argv[i], compare_usage);
      return TSR_EXIT_BAD_INPUT;
    } else {
      files[nfiles++] = argv[i];
    }
  }
  if (nfiles != 2) {
    fprintf(stderr, "tessera compare: needs two files\n%s", compare_usage);
    return TSR_EXIT_BAD_INPUT;
  }
  if (tol[2] >= 0) return compare_rel_l2(files[0], files[1], tol[2], skip, nskip);
  if (nskip) {
    fprintf(stderr, "tessera compare: --skip goes with --rel-l2\n%s", compare_usage);
    return TSR_EXIT_BAD_INPUT;
  }
  char report[8192];
  int nbad = 0;
  tsr_status st =
      tsr_dump_compare(files[0], files[1], tol[0], tol[1], report, sizeof report, &nbad);
  worst w;
  double floor = tol[1] > 0 ? 10 * tol[1] : 1e-6;
  if (st == TSR_OK) st = worst_errors(files[0], files[1], floor, &w);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera compare: %s\n", tsr_last_error());
    return TSR_EXIT_BAD_INPUT;
  }
  if (nbad) printf("%s%s", report, report[0] && report[strlen(report) - 1] != '\n' ? "\n" : "");
  printf("max abs err %.3g (%s), max rel err %.3g where |b| >= %g (%s)\n", w.abs_err,
         w.abs_name[0] ? w.abs_name : "-", w.rel_err, floor, w.rel_name[0] ? w.rel_name : "-");
  printf("%s: %d tensor%s differ%s at rtol %g, atol %g\n", nbad ? "DIFFER" : "MATCH", nbad,
         nbad == 1 ? "" : "s", nbad == 1 ? "s" : "", tol[0], tol[1]);
  return nbad ? TSR_EXIT_RUNTIME : TSR_EXIT_OK;
}
