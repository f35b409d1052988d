# `tessera tokenize` and `tessera decode` (docs/tokenize.md): the reference implementation's ids
# for each tokenizer file of tests/data/tokenizer, round trips, thread-count independence, and
# bad input. Each runs in a second or two.
set(TOKENIZE_DATA ${PROJECT_SOURCE_DIR}/tests/data/tokenizer)
foreach(name bytelevel-llama3 bytelevel-gpt2 spm-llama2 spm-metaspace)
  add_test(NAME e2e_tokenize_golden_${name}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tokenize.sh ${TESSERA_BIN} ${TOKENIZE_DATA}
            ${E2E_OUT}/tokenize_${name} golden ${name})
  set_tests_properties(e2e_tokenize_golden_${name} PROPERTIES LABELS e2e
    PASS_REGULAR_EXPRESSION "tokenize golden ${name}: ok")
endforeach()
foreach(mode roundtrip threads errors)
  add_test(NAME e2e_tokenize_${mode}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tokenize.sh ${TESSERA_BIN} ${TOKENIZE_DATA}
            ${E2E_OUT}/tokenize_${mode} ${mode})
  set_tests_properties(e2e_tokenize_${mode} PROPERTIES LABELS e2e
    PASS_REGULAR_EXPRESSION "tokenize ${mode}: ok")
endforeach()
