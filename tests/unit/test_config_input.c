/* Job files that are not plain INI text: a byte order mark, NUL bytes, text after a section
 * header, a directory or a FIFO given as the job file. None may be skipped in silence. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tessera/config.h"
#include "test_io_util.h"

#define assert_error_has(text)                                                                     \
  do {                                                                                             \
    if (!strstr(tsr_last_error(), (text)))                                                         \
      fail_msg("error \"%s\" lacks \"%s\"", tsr_last_error(), (text));                             \
  } while (0)

/* A UTF-8 BOM is accepted: the first section is read, with its errors. */
static void test_bom(void **state) {
  (void)state;
  tsr_config *cfg = NULL;
  assert_int_equal(
      tsr_config_parse_string("\xef\xbb\xbf[mesh]\ndims = dp, tp\nshape = 2, 3\n", "job.ini", &cfg),
      TSR_OK);
  assert_int_equal(cfg->mesh.ndim, 2);
  assert_int_equal(cfg->mesh.world, 6);
  assert_int_equal(tsr_config_line(cfg, "mesh", "shape"), 3);
  tsr_config_free(cfg);
  assert_int_equal(tsr_config_parse_string("\xef\xbb\xbf[mesg]\nshape = 2\n", "job.ini", &cfg),
                   TSR_EINVAL);
  assert_error_has("job.ini:1: [mesg]: unknown section; did you mean [mesh]?");
  assert_int_equal(tsr_config_parse_string("\xef\xbb\xbf[job]\nstpes = 3\n", "job.ini", &cfg),
                   TSR_EINVAL);
  assert_error_has("job.ini:2: [job] stpes: unknown key");
}

static void test_text_after_section_header(void **state) {
  (void)state;
  tsr_config *cfg = NULL;
  assert_int_equal(tsr_config_parse_string("[job] steps = 3\n", "job.ini", &cfg), TSR_EINVAL);
  assert_error_has("job.ini:1: text after ']' in a section header: 'steps = 3'");
  assert_int_equal(tsr_config_parse_string("[job]]\nsteps = 3\n", "job.ini", &cfg), TSR_EINVAL);
  assert_error_has("job.ini:1: text after ']'");
  /* blanks and a comment may follow */
  assert_int_equal(
      tsr_config_parse_string("[job]  ; the job\nsteps = 3\n[mesh]\t# the mesh\n", "job.ini", &cfg),
      TSR_OK);
  assert_int_equal(cfg->job.steps, 3);
  tsr_config_free(cfg);
}

static void test_nul_byte(void **state) {
  (void)state;
  char dir[64], path[128];
  io_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/job.ini", dir);
  static const char text[] = "[job]\nsteps = 12\0 5\n";
  io_write_file(path, text, sizeof text - 1);
  tsr_config *cfg = NULL;
  assert_int_equal(tsr_config_load(path, &cfg), TSR_EINVAL);
  assert_null(cfg);
  assert_error_has(path);
  assert_error_has(":2: a NUL byte at column 11");
  io_rmtree(dir);
}

static void alarm_handler(int sig) {
  (void)sig;
  static const char msg[] = "opening a FIFO as the job file blocked\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(1);
}

static void test_not_a_regular_file(void **state) {
  (void)state;
  char dir[64], fifo[128];
  io_tmpdir(dir, sizeof dir);
  tsr_config *cfg = NULL;
  assert_int_equal(tsr_config_load(dir, &cfg), TSR_EIO);
  assert_null(cfg);
  assert_error_has(dir);
  assert_error_has("the job file is a directory");
  snprintf(fifo, sizeof fifo, "%s/job.ini", dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  signal(SIGALRM, alarm_handler);
  alarm(5);
  assert_int_equal(tsr_config_load(fifo, &cfg), TSR_EIO);
  alarm(0);
  assert_null(cfg);
  assert_error_has("the job file is not a regular file (a FIFO");
  io_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bom),
      cmocka_unit_test(test_text_after_section_header),
      cmocka_unit_test(test_nul_byte),
      cmocka_unit_test(test_not_a_regular_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
