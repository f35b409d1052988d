# End-to-end tests of the cp_ring and cp_ulysses plugins: `tessera run` on the golden 'gqa' case
# (8 heads, 4 kv heads, seq 16) with the sequence split over the cp dims, alone, together and
# beside tp, compared with the PyTorch reference's dump (logits, loss, gradients, parameters after
# the step). The jobs are the golden one with [mesh] and [plugins] replaced, written at configure
# time with absolute paths to the golden data.

set(CP_E2E_DIR ${CMAKE_CURRENT_BINARY_DIR}/cp)
file(MAKE_DIRECTORY ${CP_E2E_DIR})
set(CP_GOLDEN ${PROJECT_SOURCE_DIR}/tests/data/golden/gqa)

# cp_e2e_job(<name> <dims> <shape> <plugins> <load_balance>) writes ${CP_E2E_DIR}/<name>.ini;
# dims, shape and plugins are ':'-separated lists.
function(cp_e2e_job name dims shape plugins balance)
  golden_mesh_job(${CP_E2E_DIR}/${name} gqa ${dims} ${shape} ${plugins}
    "[strategy.cp_ring]\nload_balance = ${balance}")
endfunction()

# name                   dims                    shape   plugins                 load_balance
set(CP_E2E_CASES
  "ring2                  ring_cp                 2       cp_ring                 none"
  "ring4_zigzag           ring_cp                 4       cp_ring                 zigzag"
  "ulysses2               ulysses_cp              2       cp_ring:cp_ulysses      none"
  "ulysses8_kv_replicated ulysess_cp              8       cp_ring:cp_ulysses      none"
  "ring2_ulysses2_zigzag  ring_cp:ulysses_cp      2:2     cp_ring:cp_ulysses      zigzag"
  "ulysses2_ring2         ulysses_cp:ring_cp      2:2     cp_ring:cp_ulysses      none"
  "tp2_ring2_ulysses2     tp:ring_cp:ulysses_cp   2:2:2   tp:cp_ring:cp_ulysses   zigzag")
foreach(row ${CP_E2E_CASES})
  string(REGEX REPLACE " +" ";" row "${row}")
  list(GET row 0 name)
  list(GET row 1 dims)
  list(GET row 2 shape)
  list(GET row 3 plugins)
  list(GET row 4 balance)
  cp_e2e_job(${name} ${dims} ${shape} ${plugins} ${balance})
  add_test(NAME e2e_cp_${name}
    COMMAND sh -c "\"$0\" run \"$1\" --no-peak && \"$0\" compare \"$2\" \"$3\" --rtol 1e-4 --atol 1e-5"
    ${TESSERA_BIN} ${CP_E2E_DIR}/${name}.ini ${CP_E2E_DIR}/${name}.safetensors
    ${CP_GOLDEN}/expected.safetensors)
  set_tests_properties(e2e_cp_${name} PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
endforeach()

# What the mesh cannot split: exit 2 before any rank starts, naming the job line and the key.
cp_e2e_job(ulysses3 ulysses_cp 3 cp_ring:cp_ulysses none)
add_test(NAME e2e_cp_heads_not_divisible
  COMMAND sh -c "\"$0\" run \"$1\" --no-peak 2>&1; echo exit=$?" ${TESSERA_BIN} ${CP_E2E_DIR}/ulysses3.ini)
set_tests_properties(e2e_cp_heads_not_divisible PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "ulysses3\\.ini:[0-9]+: \\[model\\] num_attention_heads: 8 attention heads cannot be split over ulysses_cp = 3.*exit=2")
cp_e2e_job(ring3_zigzag ring_cp 3 cp_ring zigzag)
add_test(NAME e2e_cp_seq_not_divisible
  COMMAND sh -c "\"$0\" run \"$1\" --no-peak 2>&1; echo exit=$?" ${TESSERA_BIN} ${CP_E2E_DIR}/ring3_zigzag.ini)
set_tests_properties(e2e_cp_seq_not_divisible PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "ring3_zigzag\\.ini:[0-9]+: \\[data\\] seq_len: 16 tokens cannot be split into 6 equal ring blocks.*exit=2")
