# Nothing lost, nothing silently accepted: checkpoints as one unit, outputs checked before the
# work, non-finite runs stopped, malformed job files refused.

add_test(NAME e2e_ckpt_pair
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_pair.sh ${TESSERA_BIN} ${E2E_JOBS}/resume.ini
          ${E2E_OUT}/ckpt_pair)
set_tests_properties(e2e_ckpt_pair PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "ckpt pair: ok")
