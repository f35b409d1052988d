# The README's main job on its mesh against one rank, and the per-rank state bytes that
# `tessera plan` predicts against those `tessera run` measures.
set(EXAMPLES ${PROJECT_SOURCE_DIR}/examples)

add_test(NAME e2e_main_job_vs_one_rank
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/main_job.sh ${TESSERA_BIN} ${EXAMPLES}/llama-tiny.ini
          ${E2E_OUT}/main_job)
set_tests_properties(e2e_main_job_vs_one_rank PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "main job: mesh == 1 rank")

# job, fraction of the 1-rank state every rank holds ("any": plan == run only)
foreach(case "dp_fsdp.ini 0.2500" "dp.ini 1.0000" "dp_hsdp.ini any" "tp_sp.ini any" "llama-tiny.ini any"
             "pp_interleaved.ini any")
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

# `tessera plan` lists rank 0's parameters with their placements: column-parallel q_proj split
# by rows over tp, replicated over dp, on the main job's dp 2 x tp 2 x pp 2.
add_test(NAME e2e_plan_parameters COMMAND ${TESSERA_BIN} plan ${EXAMPLES}/llama-tiny.ini)
set_tests_properties(e2e_plan_parameters PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "model\\.layers\\.0\\.self_attn\\.q_proj\\.weight +\\(128, 128\\) +-> \\(64, 128\\) +dp=R tp=S\\(0\\)")

# The per-rank peak `tessera plan` predicts (state + activations, from shapes, placements and
# the pipeline schedule) against the allocator peak `tessera run` measures, within 10 %, on 30
# meshes of the mesh matrix's job covering every plugin, for each checkpointing mode.
foreach(mode none full selective)
  add_test(NAME e2e_act_mem_${mode}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/act_mem.sh ${TESSERA_BIN}
            ${CMAKE_CURRENT_SOURCE_DIR}/jobs/mesh_matrix.ini ${mode})
  set_tests_properties(e2e_act_mem_${mode} PROPERTIES LABELS e2e
    PASS_REGULAR_EXPRESSION "activation memory \\(${mode}\\): 30 meshes, 0 failed")
endforeach()

# [job] memory_limit: plan and run refuse a job above it alike, before it runs.
add_test(NAME e2e_memory_limit
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/memory_limit.sh ${TESSERA_BIN}
          ${CMAKE_CURRENT_SOURCE_DIR}/jobs/mesh_matrix.ini ${E2E_OUT}/memory_limit)
set_tests_properties(e2e_memory_limit PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "memory_limit: refused alike by plan and run")
