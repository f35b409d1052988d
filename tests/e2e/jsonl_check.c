/* jsonl_check FILE: every line of FILE is one JSON object (cJSON). Prints "N objects" and exits 0,
 * or names the first line that is not and exits 1. For [output] metrics (metrics.sh). */
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: jsonl_check FILE\n");
    return 2;
  }
  FILE *f = fopen(argv[1], "r");
  if (!f) {
    printf("cannot open %s\n", argv[1]);
    return 1;
  }
  char *line = NULL;
  size_t cap = 0;
  long n = 0;
  while (getline(&line, &cap, f) > 0) {
    n++;
    cJSON *o = cJSON_Parse(line);
    if (!cJSON_IsObject(o)) {
      printf("line %ld is not a JSON object: %s", n, line);
      return 1;
    }
    cJSON_Delete(o);
  }
  free(line);
  fclose(f);
  printf("%ld objects\n", n);
  return 0;
}
