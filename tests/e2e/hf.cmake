# Hugging Face folders in and out, and `tessera generate` (docs/hf.md, docs/generate.md):
# tests/e2e/hf.sh. Needs no Python: the golden continuations are committed
# (tests/golden/make_generate.py made them) and the round trip is checked with `tessera compare`.
foreach(mode generate roundtrip errors text)
  add_test(NAME e2e_hf_${mode}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/hf.sh ${TESSERA_BIN} ${GOLDEN} ${E2E_OUT}/hf_${mode}
            ${mode} ${PROJECT_SOURCE_DIR}/tests/data/tokenizer)
  set_tests_properties(e2e_hf_${mode} PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "hf ${mode}.*ok"
    FAIL_REGULAR_EXPRESSION "hf ${mode}: [^o]")
endforeach()

# The folder's layout against the format, by a reader of its own (standard-library Python, no
# torch), when a python3 is there.
find_program(TESSERA_PYTHON3 python3)
if(TESSERA_PYTHON3)
  add_test(NAME e2e_hf_layout
    COMMAND sh -c "rm -rf \"$2\" && \"$0\" export \"$3/moe/job.ini\" \"$2/moe\" --shard-size 100KB && \"$1\" \"$4\" layout \"$2/moe\" && \"$1\" \"$4\" same \"$2/moe\" \"$3/moe/model.safetensors\" && \"$0\" export \"$3/gqa/job.ini\" \"$2/gqa\" --dtype bf16 && \"$1\" \"$4\" layout \"$2/gqa\" && \"$1\" \"$4\" bf16 \"$2/gqa\" \"$3/gqa/model.safetensors\""
    ${TESSERA_BIN} ${TESSERA_PYTHON3} ${E2E_OUT}/hf_layout ${GOLDEN}
    ${CMAKE_CURRENT_SOURCE_DIR}/hf_check.py)
  set_tests_properties(e2e_hf_layout PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "bf16: ok")
  # an F16 folder (written by the checker) loads, converted to f32 exactly
  add_test(NAME e2e_hf_f16
    COMMAND sh -c "rm -rf \"$2\" && \"$0\" export \"$3/gqa/job.ini\" \"$2/f32\" && \"$1\" \"$4\" half \"$2/f32\" \"$2/f16\" && \"$0\" export \"$3/gqa/job.ini\" \"$2/back\" --checkpoint \"$2/f16\" && \"$1\" \"$4\" widened \"$2/back\" \"$2/f16\""
    ${TESSERA_BIN} ${TESSERA_PYTHON3} ${E2E_OUT}/hf_f16 ${GOLDEN}
    ${CMAKE_CURRENT_SOURCE_DIR}/hf_check.py)
  set_tests_properties(e2e_hf_f16 PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "widened: ok")
endif()
