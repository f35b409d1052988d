# Long runs (docs/training.md): evaluation on held-out data, non-finite guards, traces of any
# mesh, metrics files, dumps of any step, and stopping on a signal.

# [eval]: equal to the 1-rank evaluation under dp, tp, pp, ring_cp and pp x dp x tp; the training
# the same with and without it; its keys' errors.
add_test(NAME e2e_eval
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/eval.sh ${TESSERA_BIN} ${E2E_JOBS}/mesh_matrix.ini
          ${PROJECT_SOURCE_DIR}/examples/data/tessera-docs.txt ${E2E_OUT}/eval)
set_tests_properties(e2e_eval PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "eval: ok")

# [job] on_nonfinite: stop names the step, the rows and the first non-finite gradient; skip_step
# skips exactly that update, on 1 and 8 ranks alike (gradients and losses made NaN on purpose).
add_test(NAME e2e_guard
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/guard.sh ${TESSERA_BIN} ${E2E_JOBS}/mesh_matrix.ini
          ${E2E_OUT}/guard)
set_tests_properties(e2e_guard PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "guard: ok")

# [output] trace for any mesh: valid JSON, a track per rank with steps, ops, communication per
# mesh dim and (with pp) pipeline actions, nested.
add_executable(trace_check ${CMAKE_CURRENT_SOURCE_DIR}/trace_check.c)
target_link_libraries(trace_check PRIVATE PkgConfig::CJSON)
add_test(NAME e2e_trace
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/trace.sh ${TESSERA_BIN} $<TARGET_FILE:trace_check>
          ${E2E_JOBS}/mesh_matrix.ini ${E2E_OUT}/trace)
set_tests_properties(e2e_trace PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "trace: ok")

# [output] metrics: a JSON object per step and per evaluation with the log's figures, rank 0
# alone, kept up to the checkpoint on resume and up to the failure on a failed run, checked and
# written like every output.
add_executable(jsonl_check ${CMAKE_CURRENT_SOURCE_DIR}/jsonl_check.c)
target_link_libraries(jsonl_check PRIVATE PkgConfig::CJSON)
add_test(NAME e2e_metrics
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/metrics.sh ${TESSERA_BIN} $<TARGET_FILE:jsonl_check>
          ${E2E_JOBS}/mesh_matrix.ini ${E2E_OUT}/metrics)
set_tests_properties(e2e_metrics PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "metrics: ok")

# --dump-step K: step K of a longer run, bit for bit the first step of a run resumed at K - 1 and
# the last of a run stopped at K, on 1 and 8 ranks; bad steps refused.
add_test(NAME e2e_dump_step
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/dump_step.sh ${TESSERA_BIN} ${E2E_JOBS}/mesh_matrix.ini
          ${E2E_OUT}/dump_step)
set_tests_properties(e2e_dump_step PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "dump step: ok")

# SIGTERM / SIGINT: the step finishes, the checkpoint is written at it, exit 143 / 130 with one
# line; 8 thread ranks stop together; a log reader gone after the signal changes nothing; a second
# SIGINT exits at once; with the mpi backend built, one signalled process stops both of a job.
if(TARGET tessera-mpi)
  set(SIGNAL_MPIRUN ${TESSERA_MPIRUN})
endif()
add_test(NAME e2e_signal
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/signal.sh ${TESSERA_BIN} ${E2E_JOBS}/mesh_matrix.ini
          ${E2E_OUT}/signal ${SIGNAL_MPIRUN})
set_tests_properties(e2e_signal PROPERTIES LABELS e2e TIMEOUT 300 PASS_REGULAR_EXPRESSION "signal: ok")

# `tessera run` runs with OPENBLAS_THREAD_TIMEOUT=18 when it was unset (it executes itself again,
# docs/kernels.md) and with the user's value when set; skipped (77) without /proc.
add_test(NAME e2e_blas_env
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/blas_env.sh ${TESSERA_BIN} ${PROJECT_SOURCE_DIR}/examples/single.ini)
set_tests_properties(e2e_blas_env PROPERTIES LABELS e2e TIMEOUT 120 SKIP_RETURN_CODE 77
  PASS_REGULAR_EXPRESSION "blas env: ok")

# [output] tensorboard: the event file read back by an independent reader (python3-protobuf, the
# messages built from a descriptor in the script, both CRCs of every record recomputed), equal to
# the metrics lines of the same run on 8 ranks and in forward mode; the path's errors. Skipped
# (77) where python3 or google.protobuf is missing.
add_test(NAME e2e_metrics_tensorboard
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tboard.sh ${TESSERA_BIN} ${E2E_JOBS}/mesh_matrix.ini
          ${E2E_OUT}/tensorboard)
set_tests_properties(e2e_metrics_tensorboard PROPERTIES LABELS e2e SKIP_RETURN_CODE 77
  SKIP_REGULAR_EXPRESSION "tensorboard: skipped"
  PASS_REGULAR_EXPRESSION "tensorboard: ok")
