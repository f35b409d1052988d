# The README's main job on its mesh against one rank, and the per-rank state bytes that
# `tessera plan` predicts against those `tessera run` measures.
set(EXAMPLES ${PROJECT_SOURCE_DIR}/examples)

add_test(NAME e2e_main_job_vs_one_rank
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/main_job.sh ${TESSERA_BIN} ${EXAMPLES}/llama-tiny.ini
          ${E2E_OUT}/main_job)
set_tests_properties(e2e_main_job_vs_one_rank PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "main job: mesh == 1 rank")

# job, fraction of the 1-rank state every rank holds ("any": plan == run only)
foreach(case "dp_fsdp.ini 0.2500" "dp.ini 1.0000" "dp_hsdp.ini any" "tp_sp.ini any" "llama-tiny.ini any")
  separate_arguments(case)
  list(GET case 0 job)
  list(GET case 1 fraction)
  string(REPLACE ".ini" "" name ${job})
  if(fraction STREQUAL "any")
    set(fraction "[0-9.]*")
  endif()
  add_test(NAME e2e_state_bytes_${name}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/state_bytes.sh ${TESSERA_BIN} ${EXAMPLES}/${job} ${fraction})
  set_tests_properties(e2e_state_bytes_${name} PROPERTIES LABELS e2e
    PASS_REGULAR_EXPRESSION "state bytes: plan == run")
endforeach()
