# End-to-end tests of the tp and sp plugins: `tessera run` on the golden cases with the tp dim
# split, compared with the PyTorch reference's dump as the 1-rank golden tests compare it. The
# jobs are the golden ones with [mesh] tp and [plugins] load changed, written at configure time
# with absolute paths to the golden data.

set(TP_E2E_DIR ${CMAKE_CURRENT_BINARY_DIR}/tp)
file(MAKE_DIRECTORY ${TP_E2E_DIR})

# tp_e2e_job(<name> <golden case> <tp> <plugins> <loss_parallel>) writes ${TP_E2E_DIR}/<name>.ini
function(tp_e2e_job name golden tp plugins loss_parallel)
  string(REPLACE ", " ":" plugins "${plugins}")
  golden_mesh_job(${TP_E2E_DIR}/${name} ${golden} dp:tp 1:${tp} "${plugins}"
    "[strategy.tp]\nloss_parallel = ${loss_parallel}")
endfunction()

# name           golden  tp  plugins  loss_parallel
set(TP_E2E_CASES
  "gqa_tp2         gqa     2   tp       true"
  "gqa_tp4         gqa     4   tp       true"
  "gqa_tp4_gather  gqa     4   tp       false"
  "gqa_sp2         gqa     2   tp,sp    true"
  "gqa_sp4         gqa     4   tp,sp    true"
  "uneven_tp6      uneven  6   tp       true"
  "uneven_sp2      uneven  2   tp,sp    true"
  "tied_tp2        tied    2   tp       true"
  "tied_sp4        tied    4   tp,sp    false")
foreach(row ${TP_E2E_CASES})
  string(REGEX REPLACE " +" ";" row "${row}")
  list(GET row 0 name)
  list(GET row 1 golden)
  list(GET row 2 tp)
  list(GET row 3 plugins)
  list(GET row 4 lp)
  string(REPLACE "," ", " plugins "${plugins}")
  tp_e2e_job(${name} ${golden} ${tp} "${plugins}" ${lp})
  add_test(NAME e2e_tp_${name}
    COMMAND sh -c "\"$0\" run \"$1\" --no-peak && \"$0\" compare \"$2\" \"$3\" --rtol 1e-4 --atol 1e-5"
    ${TESSERA_BIN} ${TP_E2E_DIR}/${name}.ini ${TP_E2E_DIR}/${name}.safetensors
    ${PROJECT_SOURCE_DIR}/tests/data/golden/${golden}/expected.safetensors)
  set_tests_properties(e2e_tp_${name} PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
endforeach()

# Heads that tp cannot split: exit 2 before any rank starts, naming the job line and the key.
tp_e2e_job(gqa_tp3 gqa 3 tp true)
add_test(NAME e2e_tp_heads_not_divisible
  COMMAND sh -c "\"$0\" run \"$1\" --no-peak 2>&1; echo exit=$?" ${TESSERA_BIN} ${TP_E2E_DIR}/gqa_tp3.ini)
set_tests_properties(e2e_tp_heads_not_divisible PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "gqa_tp3\\.ini:[0-9]+: \\[model\\] num_attention_heads: 8 attention heads cannot be split over tp = 3.*exit=2")
