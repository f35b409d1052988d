# End-to-end tests of the dp plugin: `tessera run` on the golden cases (PyTorch reference dumps of
# one training step: logits, loss, gradients before clipping, parameters after AdamW) with the
# batch split over dp, dp_shard (FSDP) and dp_replicate x dp_shard (HSDP), evenly and not, beside
# tp, and with the tied embedding gathered for both of its uses. The jobs are the golden ones with
# [mesh], [plugins] and [strategy.dp] replaced, written at configure time with absolute paths.

set(DP_E2E_DIR ${CMAKE_CURRENT_BINARY_DIR}/dp)
file(MAKE_DIRECTORY ${DP_E2E_DIR})

# dp_e2e_job(<name> <golden case> <dims> <shape> <plugins> <bucket_mb>) writes
# ${DP_E2E_DIR}/<name>.ini; dims, shape and plugins are ':'-separated.
function(dp_e2e_job name golden dims shape plugins bucket_mb)
  golden_mesh_job(${DP_E2E_DIR}/${name} ${golden} ${dims} ${shape} ${plugins}
    "[strategy.dp]\nbucket_mb = ${bucket_mb}")
endfunction()

# name                  golden   dims                     shape   plugins  bucket_mb
set(DP_E2E_CASES
  "gqa_dp2               gqa      dp                       2       dp       25"
  "gqa_fsdp2             gqa      dp_shard                 2       dp       25"
  "uneven_dp2            uneven   dp                       2       dp       25"
  "uneven_fsdp3          uneven   dp_shard                 3       dp       0"
  "uneven_hsdp2x2        uneven   dp_replicate:dp_shard    2:2     dp       0.01"
  "tied_fsdp2            tied     dp_shard                 2       dp       25"
  "gqa_fsdp2_tp2         gqa      dp_shard:tp              2:2     dp:tp    25"
  "uneven_dp2_tp2        uneven   dp:tp                    2:2     dp:tp    25"
  "moe_dp2               moe      dp                       2       dp       25"
  "moe_fsdp2_tp2         moe      dp_shard:tp              2:2     dp:tp    25"
  "moe_sparse_tp2        moe_sparse dp:tp                  1:2     dp:tp    0"
  "moe_tp2_sp            moe      dp:tp                    1:2     dp:tp:sp 0")
foreach(row ${DP_E2E_CASES})
  string(REGEX REPLACE " +" ";" row "${row}")
  list(GET row 0 name)
  list(GET row 1 golden)
  list(GET row 2 dims)
  list(GET row 3 shape)
  list(GET row 4 plugins)
  list(GET row 5 bucket_mb)
  dp_e2e_job(${name} ${golden} ${dims} ${shape} ${plugins} ${bucket_mb})
  add_test(NAME e2e_dp_${name}
    COMMAND sh -c "\"$0\" run \"$1\" --no-peak && \"$0\" compare \"$2\" \"$3\" --rtol 1e-4 --atol 1e-5"
    ${TESSERA_BIN} ${DP_E2E_DIR}/${name}.ini ${DP_E2E_DIR}/${name}.safetensors
    ${PROJECT_SOURCE_DIR}/tests/data/golden/${golden}/expected.safetensors)
  set_tests_properties(e2e_dp_${name} PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
endforeach()

# dp beside dp_shard contradicts itself: exit 2 before any rank starts, naming the line and fix.
dp_e2e_job(dp_and_shard gqa dp:dp_shard 2:2 dp 25)
add_test(NAME e2e_dp_mixed_dims
  COMMAND sh -c "\"$0\" run \"$1\" --no-peak 2>&1; echo exit=$?" ${TESSERA_BIN} ${DP_E2E_DIR}/dp_and_shard.ini)
set_tests_properties(e2e_dp_mixed_dims PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "dp_and_shard\\.ini:[0-9]+: \\[mesh\\] dims: dp = 2 beside dp_replicate = 1 and dp_shard = 2.*exit=2")
