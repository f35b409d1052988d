# End-to-end tests of the ep plugin: `tessera run` on the golden MoE cases ('moe': 4 experts in
# both layers; 'moe_sparse': 6 experts in one layer of three, tied embeddings) with the batch and
# the experts split over ep, alone and beside dp, FSDP, tp, sp, ring_cp, ulysses_cp and pp (whose
# stages the load-balancing loss cannot cross yet: that case runs without it), each compared with
# the 1-rank run of the same job (logits, loss, gradients, parameters after the step) at the
# tolerance the plugin guide gives a mesh against one rank. Batch 2 over ep = 4 or 6 leaves ranks without a
# token that still serve their experts. Also the dense 'gqa' case, where ep is data parallelism,
# and the jobs ep refuses. The jobs are the golden ones with [mesh] and [plugins] replaced,
# written at configure time with absolute paths.

set(EP_E2E_DIR ${CMAKE_CURRENT_BINARY_DIR}/ep)
file(MAKE_DIRECTORY ${EP_E2E_DIR})

# ep_e2e_job(<name> <golden case> <dims> <shape> <plugins>) writes ${EP_E2E_DIR}/<name>.ini;
# dims, shape and plugins are ':'-separated.
function(ep_e2e_job name golden dims shape plugins)
  golden_mesh_job(${EP_E2E_DIR}/${name} ${golden} ${dims} ${shape} ${plugins})
endfunction()

# name               golden      dims                shape   plugins          --set (- for none)
set(EP_E2E_CASES
  "moe_ep2            moe         ep                  2       ep               -"
  "moe_ep4            moe         ep                  4       ep               -"
  "moe_dp2_ep2        moe         dp:ep               2:2     dp:ep            -"
  "moe_fsdp2_ep2      moe         dp_shard:ep         2:2     dp:ep            -"
  "moe_ep2_tp2        moe         ep:tp               2:2     ep:tp            -"
  "moe_ep2_tp2_sp     moe         ep:tp               2:2     ep:tp:sp         -"
  "moe_ep2_ring2      moe         ep:ring_cp          2:2     ep:cp_ring       -"
  "moe_ep2_ulysses2   moe         ep:ulysses_cp       2:2     ep:cp_ulysses    -"
  "moe_ep2_pp2        moe         ep:pp               2:2     ep:pp            model.router_aux_loss_coef=0"
  "moe_sparse_ep2     moe_sparse  ep                  2       ep               -"
  "moe_sparse_ep3     moe_sparse  ep                  3       ep               -"
  "moe_sparse_ep6     moe_sparse  ep                  6       ep               -"
  "moe_sparse_ep2_tp2 moe_sparse  ep:tp               2:2     ep:tp            -"
  "gqa_ep2            gqa         ep                  2       ep               -")
foreach(row ${EP_E2E_CASES})
  string(REGEX REPLACE " +" ";" row "${row}")
  list(GET row 0 name)
  list(GET row 1 golden)
  list(GET row 2 dims)
  list(GET row 3 shape)
  list(GET row 4 plugins)
  list(GET row 5 set)
  ep_e2e_job(${name} ${golden} ${dims} ${shape} ${plugins})
  # the 1-rank run is the same job with every mesh dim of size 1
  string(REGEX REPLACE "[0-9]+" "1" one "${shape}")
  string(REPLACE ":" "," one "${one}")
  set(sets "")
  if(NOT set STREQUAL "-")
    set(sets "--set ${set}")
  endif()
  # four steps, the state after the fourth compared (AdamW moments built up, routing moved)
  set(steps "--set job.steps=4 --dump-step 4")
  add_test(NAME e2e_ep_${name}
    COMMAND sh -c "\"$0\" run \"$1\" --no-peak ${sets} ${steps} --set mesh.shape=${one} --dump \"$3\" && \"$0\" run \"$1\" --no-peak ${sets} ${steps} && \"$0\" compare \"$2\" \"$3\" --rtol 1e-4 --atol 1e-4"
    ${TESSERA_BIN} ${EP_E2E_DIR}/${name}.ini ${EP_E2E_DIR}/${name}.safetensors
    ${EP_E2E_DIR}/${name}_one.safetensors)
  set_tests_properties(e2e_ep_${name} PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
endforeach()

# What ep refuses: exit 2 before any rank starts, naming the job line, the key and the fix. (A
# device other than the CPU is refused by the core before ep sees an MoE job; test_ep checks
# ep's own refusal.)
ep_e2e_job(moe_ep3 moe ep 3 ep)
add_test(NAME e2e_ep_experts_not_divisible
  COMMAND sh -c "\"$0\" run \"$1\" --no-peak 2>&1; echo exit=$?" ${TESSERA_BIN} ${EP_E2E_DIR}/moe_ep3.ini)
set_tests_properties(e2e_ep_experts_not_divisible PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "moe_ep3\\.ini:[0-9]+: \\[model\\] num_local_experts: 4 experts cannot be split over ep = 3.*use a multiple of 3 experts, or an ep that divides 4.*exit=2")

# An MoE job on a mesh with ep > 1 but without the plugin: the dim has no owner.
ep_e2e_job(moe_ep2_unowned moe ep 2 dp)
add_test(NAME e2e_ep_unowned
  COMMAND sh -c "\"$0\" run \"$1\" --no-peak 2>&1; echo exit=$?" ${TESSERA_BIN} ${EP_E2E_DIR}/moe_ep2_unowned.ini)
set_tests_properties(e2e_ep_unowned PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "dim 'ep' has size 2 but no loaded plugin owns it.*add the plugin that owns 'ep' to \\[plugins\\] load.*exit=2")
