# Nothing lost, nothing silently accepted: checkpoints as one unit, outputs checked before the
# work, non-finite runs stopped, malformed job files refused.

add_test(NAME e2e_ckpt_pair
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_pair.sh ${TESSERA_BIN} ${E2E_JOBS}/resume.ini
          ${E2E_OUT}/ckpt_pair)
set_tests_properties(e2e_ckpt_pair PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "ckpt pair: ok")

# Every input opens and every output can be written before any step, in `plan` too; an output
# is never an input (device and inode) nor another output.
add_test(NAME e2e_job_files
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/job_files.sh ${TESSERA_BIN} ${E2E_JOBS}/accum.ini
          ${E2E_OUT}/job_files)
set_tests_properties(e2e_job_files PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "job files: ok")

add_test(NAME e2e_trace_symlink
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/trace_symlink.sh ${TESSERA_BIN} ${E2E_JOBS}/pp2.ini
          ${E2E_OUT}/trace_symlink)
set_tests_properties(e2e_trace_symlink PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "trace symlink: ok")
