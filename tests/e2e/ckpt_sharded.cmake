# Sharded checkpoints ([checkpoint] dir, every, keep_last, load = latest; docs/training.md): saved
# under one mesh, resumed under others, each resumed run bit for bit the same mesh resumed from the
# full-tensor export and within rtol 1e-4 of the uninterrupted run (ckpt_reshard.sh); a kill -9 at
# each point of a save leaves the previous checkpoint loadable; the keys' errors.
set(CKPT_JOB ${E2E_JOBS}/mesh_matrix.ini)
set(CKPT_MOE --set plugins.load=dp,tp,pp,cp_ring,cp_ulysses,ep --set model.num_local_experts=4
  --set model.num_experts_per_tok=2 --set model.decoder_sparse_step=2)
# ckpt_reshard(<name> <dims> <shape> <resumed under: dims:shape ..., - for one rank> [-- keys])
function(ckpt_reshard name dims shape)
  add_test(NAME e2e_ckpt_reshard_${name}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_reshard.sh ${TESSERA_BIN} ${CKPT_JOB}
            ${E2E_OUT}/ckpt_reshard_${name} ${dims} ${shape} ${ARGN})
  set_tests_properties(e2e_ckpt_reshard_${name} PROPERTIES LABELS e2e
    PASS_REGULAR_EXPRESSION "ckpt reshard: ok")
endfunction()
ckpt_reshard(3d pp,dp,tp 2,2,2 tp:4 pp,ring_cp:2,2 dp_replicate,dp_shard:2,2 -:-)
ckpt_reshard(fsdp dp_shard 4 tp:4 pp,ring_cp:2,2 dp_replicate,dp_shard:2,2 -:-)
ckpt_reshard(moe_ep ep 2 -:- ep,tp:2,2 dp_shard,ep:2,2 ep:4 -- ${CKPT_MOE})
ckpt_reshard(tied_pp pp,tp 2,2 -:- pp:4 -- --set model.tie_word_embeddings=true)
ckpt_reshard(one_rank - - pp,dp:2,2 dp_shard,tp:2,2)
# device = emu: shards leave and enter device memory through host copies
ckpt_reshard(emu pp,dp,tp 2,2,2 tp:4 -:- -- --set job.device=emu)

add_test(NAME e2e_ckpt_sharded_kill
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_sharded_kill.sh ${TESSERA_BIN} ${CKPT_JOB}
          ${E2E_OUT}/ckpt_sharded_kill)
set_tests_properties(e2e_ckpt_sharded_kill PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "ckpt sharded kill: ok")

add_test(NAME e2e_ckpt_sharded_errors
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_sharded_errors.sh ${TESSERA_BIN} ${CKPT_JOB}
          ${E2E_OUT}/ckpt_sharded_errors)
set_tests_properties(e2e_ckpt_sharded_errors PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "ckpt sharded errors: ok")

# [checkpoint] async = true: the same bytes as the sync saves, resumes equal on 1 rank and on
# pp x dp x tp, a failed background write stops the run and leaves the previous checkpoint, the
# key's errors; and the kill -9 points of a save written in the background.
add_test(NAME e2e_ckpt_async
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_async.sh ${TESSERA_BIN} ${CKPT_JOB}
          ${E2E_OUT}/ckpt_async)
set_tests_properties(e2e_ckpt_async PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "ckpt async: ok")
add_test(NAME e2e_ckpt_sharded_kill_async
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_sharded_kill.sh ${TESSERA_BIN} ${CKPT_JOB}
          ${E2E_OUT}/ckpt_sharded_kill_async async)
set_tests_properties(e2e_ckpt_sharded_kill_async PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "ckpt sharded kill: ok \\(and SIGTERM; async\\)")

# tessera export of a sharded checkpoint folder (--checkpoint DIR/step-N, load = latest): the
# same Hugging Face folder, byte for byte, as the export of the full-tensor file of that step,
# under pp x dp x tp and with MoE experts over ep; another model's folder refused.
add_test(NAME e2e_ckpt_export
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_export.sh ${TESSERA_BIN} ${CKPT_JOB}
          ${E2E_OUT}/ckpt_export)
set_tests_properties(e2e_ckpt_export PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "ckpt export: ok")
