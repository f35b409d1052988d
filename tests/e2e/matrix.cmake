# The mesh matrix: one training step under every mesh of up to 16 ranks from pp, dp, ring_cp,
# ulysses_cp and tp of sizes 1 or 2, plus sizes 3 and 4 and FSDP / HSDP, against the 1-rank run.
add_test(NAME e2e_mesh_matrix
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/mesh_matrix.sh ${TESSERA_BIN}
          ${CMAKE_CURRENT_SOURCE_DIR}/jobs/mesh_matrix.ini ${E2E_OUT}/mesh_matrix)
set_tests_properties(e2e_mesh_matrix PROPERTIES LABELS e2e TIMEOUT 900
  PASS_REGULAR_EXPRESSION "mesh matrix on cpu in f32: [0-9]+ passed, [0-9]+ skipped, 0 failed")
# The same meshes with layers 1 and 3 Mixtral MoE layers (experts replicated, or sharded over ep).
add_test(NAME e2e_mesh_matrix_moe
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/mesh_matrix.sh ${TESSERA_BIN}
          ${CMAKE_CURRENT_SOURCE_DIR}/jobs/mesh_matrix.ini ${E2E_OUT}/mesh_matrix_moe)
set_tests_properties(e2e_mesh_matrix_moe PROPERTIES LABELS e2e TIMEOUT 900 ENVIRONMENT MOE=1
  PASS_REGULAR_EXPRESSION "mesh matrix on cpu in f32 with MoE: [0-9]+ passed, [0-9]+ skipped, 0 failed")
# The same meshes as virtual ranks on one device: the emulated one, whose memory the host cannot
# touch, so a rule that reads device memory from the host crashes here instead of on a GPU.
add_test(NAME e2e_mesh_matrix_emu
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/mesh_matrix.sh ${TESSERA_BIN}
          ${CMAKE_CURRENT_SOURCE_DIR}/jobs/mesh_matrix.ini ${E2E_OUT}/mesh_matrix_emu)
set_tests_properties(e2e_mesh_matrix_emu PROPERTIES LABELS e2e TIMEOUT 900 ENVIRONMENT DEVICE=emu
  PASS_REGULAR_EXPRESSION "mesh matrix on emu in f32: [0-9]+ passed, [0-9]+ skipped, 0 failed")

# The same meshes in mixed precision ([job] dtype = bf16) against the 1-rank bf16 run, by
# relative L2 error per tensor (mesh_matrix.sh says why and how far).
add_test(NAME e2e_mesh_matrix_bf16
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/mesh_matrix.sh ${TESSERA_BIN}
          ${CMAKE_CURRENT_SOURCE_DIR}/jobs/mesh_matrix.ini ${E2E_OUT}/mesh_matrix_bf16)
set_tests_properties(e2e_mesh_matrix_bf16 PROPERTIES LABELS e2e TIMEOUT 900 ENVIRONMENT DTYPE=bf16
  PASS_REGULAR_EXPRESSION "mesh matrix on cpu in bf16: [0-9]+ passed, [0-9]+ skipped, 0 failed")

# --set mesh.dims without a matching shape is refused after all overrides are applied.
add_test(NAME e2e_set_mesh_mismatch
  COMMAND sh -c "\"$0\" run \"$1\" --no-peak --set mesh.dims=dp,tp 2>&1; echo exit=$?"
  ${TESSERA_BIN} ${CMAKE_CURRENT_SOURCE_DIR}/jobs/mesh_matrix.ini)
set_tests_properties(e2e_set_mesh_mismatch PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "dims names 2 dims but shape gives 5 sizes.*exit=2")

# --set reaches a plugin's keys: a schedule the pp plugin does not know is refused by the plugin.
add_test(NAME e2e_set_strategy_key
  COMMAND sh -c "\"$0\" run \"$1\" --no-peak --set strategy.pp.schedule=fifo 2>&1; echo exit=$?"
  ${TESSERA_BIN} ${CMAKE_CURRENT_SOURCE_DIR}/jobs/mesh_matrix.ini)
set_tests_properties(e2e_set_strategy_key PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "schedule.*fifo.*exit=2")
add_test(NAME e2e_set_strategy_key_applies
  COMMAND ${TESSERA_BIN} run ${CMAKE_CURRENT_SOURCE_DIR}/jobs/mesh_matrix.ini --no-peak
          --set mesh.shape=2,1,1,1,1 --set strategy.pp.schedule=gpipe --set strategy.pp.microbatches=4)
set_tests_properties(e2e_set_strategy_key_applies PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "pipeline: schedule gpipe, 4 microbatches")
add_test(NAME e2e_set_strategy_unloaded
  COMMAND sh -c "\"$0\" run \"$1\" --no-peak --set strategy.tpp.x=1 2>&1; echo exit=$?"
  ${TESSERA_BIN} ${CMAKE_CURRENT_SOURCE_DIR}/jobs/mesh_matrix.ini)
set_tests_properties(e2e_set_strategy_unloaded PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "\\[strategy\\.tpp\\] is set but plugin 'tpp' is not in \\[plugins\\] load.*exit=2")

# Activation checkpointing, full and selective, is bit-identical to none on 14 meshes
# (act_ckpt.sh), MoE, ep, FSDP and the zero-bubble schedule among
# them, and lowers each rank's peak.
add_test(NAME e2e_activation_checkpointing
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/act_ckpt.sh ${TESSERA_BIN}
          ${CMAKE_CURRENT_SOURCE_DIR}/jobs/mesh_matrix.ini ${E2E_OUT}/act_ckpt)
set_tests_properties(e2e_activation_checkpointing PROPERTIES LABELS e2e TIMEOUT 900
  PASS_REGULAR_EXPRESSION "activation checkpointing: 1[4-9] meshes, 0 failed")
