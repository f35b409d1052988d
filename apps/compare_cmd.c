/* `tessera compare`: two dumps, tensor by tensor, with the worst errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "tessera/io.h"

static const char compare_usage[] =
    "usage: tessera compare A.safetensors B.safetensors [--rtol R] [--atol A]\n"
    "\n"
    "Compares two dumps (or any safetensors files of float tensors) tensor by tensor: an element\n"
    "agrees when |a - b| <= atol + rtol * |b| (b from the second file; NaN never agrees). Prints\n"
    "every tensor that disagrees with its worst element, then the largest absolute and relative\n"
    "errors over all tensors (relative ones where |b| >= 10 atol). Defaults: rtol 1e-4, atol "
    "1e-5.\n"
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

int tsr_cmd_compare(int argc, char **argv) {
  if (tsr_app_wants_help(argc, argv)) {
    fputs(compare_usage, stdout);
    return TSR_EXIT_OK;
  }
  const char *files[2] = {NULL, NULL};
  int nfiles = 0;
  double tol[2] = {1e-4, 1e-5};
  for (int i = 1; i < argc; i++) {
    int which = !strcmp(argv[i], "--rtol") ? 0 : !strcmp(argv[i], "--atol") ? 1 : -1;
    if (which >= 0) {
      char *end = NULL;
      if (i + 1 < argc) tol[which] = strtod(argv[i + 1], &end);
      if (i + 1 >= argc || *end || !(tol[which] >= 0)) {
        fprintf(stderr, "tessera compare: %s needs a number >= 0\n%s", argv[i], compare_usage);
        return TSR_EXIT_BAD_INPUT;
      }
      i++;
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
