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

# A diverged run stops with exit 1 naming the step and saves nothing over the good checkpoint;
# a NaN checkpoint is refused at load naming the tensor; eps = 0 is refused.
add_test(NAME e2e_nonfinite
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/nonfinite.sh ${TESSERA_BIN} ${E2E_JOBS}/accum.ini
          ${E2E_OUT}/nonfinite)
set_tests_properties(e2e_nonfinite PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "nonfinite: ok")

# A microbatch of ignored labels only weighs nothing: a finite loss, the run goes on.
add_test(NAME e2e_ignored_microbatch
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/ignored_microbatch.sh ${TESSERA_BIN}
          ${E2E_JOBS}/accum.ini ${E2E_OUT}/ignored_microbatch)
set_tests_properties(e2e_ignored_microbatch PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "ignored microbatch: ok")

# tessera compare: non-finite values agree only with the same value at the same place.
add_test(NAME e2e_compare_nonfinite
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/compare_nonfinite.sh ${TESSERA_BIN}
          ${E2E_OUT}/compare_nonfinite)
set_tests_properties(e2e_compare_nonfinite PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "compare nonfinite: ok")

# Paths too long for a buffer are errors, never cut (a job under a 1,200-character path, --set
# relative paths from a long current directory).
add_test(NAME e2e_long_paths
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/long_paths.sh ${TESSERA_BIN} ${E2E_JOBS}/accum.ini
          ${E2E_OUT}/long_paths)
set_tests_properties(e2e_long_paths PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "long paths: ok")

# --set gets the file's checks (world size, mesh product without overflow), is reported as
# "--set SECTION.KEY", and takes [plugins] path entries from the current directory.
add_test(NAME e2e_set_checks
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/set_checks.sh ${TESSERA_BIN} ${E2E_JOBS}/accum.ini
          ${E2E_OUT}/set_checks)
set_tests_properties(e2e_set_checks PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "set checks: ok")

# Whatever run refuses, plan refuses first with the same message and exit code: two communicating
# rules for sdpa, a rule refusing what another hands it, a local world of 4096 ranks,
# grad_accum_steps that does not divide the batch. Plan runs the first step to find them.
add_test(NAME e2e_plan_refuses
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/plan_refuses.sh ${TESSERA_BIN} ${E2E_JOBS}/accum.ini
          ${E2E_OUT}/plan_refuses)
set_tests_properties(e2e_plan_refuses PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "plan refuses: ok")

# backend = local under an MPI launcher of several processes is refused, naming backend = mpi:
# each process would run the whole job and write the same files.
add_test(NAME e2e_mpi_env
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/mpi_env.sh ${TESSERA_BIN} ${E2E_JOBS}/accum.ini
          ${E2E_OUT}/mpi_env)
set_tests_properties(e2e_mpi_env PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "mpi env: ok")

# Before any model is built, the state of this process's ranks must fit the memory it may use
# (physical, cgroup, ulimit -v): a 1.3 TB job is refused at once, a 586 MiB ulimit refuses a
# 968 MiB state, and four dp replicas that fit one by one but not together, naming the rank.
add_test(NAME e2e_mem_check
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/mem_check.sh ${TESSERA_BIN} ${E2E_JOBS}/accum.ini
          ${E2E_OUT}/mem_check)
set_tests_properties(e2e_mem_check PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "mem check: ok")

# A run killed (SIGKILL) at each point of a save over a good checkpoint: the next run resumes the
# last complete checkpoint and ends bit for bit as an uninterrupted run from it; a mixed pair is
# refused; the dead writer's temporaries are removed by the next save.
add_test(NAME e2e_ckpt_kill
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_kill.sh ${TESSERA_BIN} ${E2E_JOBS}/resume.ini
          ${E2E_OUT}/ckpt_kill)
set_tests_properties(e2e_ckpt_kill PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "ckpt kill: ok")
