# [data] mask = document (docs/data.md): one step under every plugin that touches attention equals
# the 1-rank document-masked step, and bad combinations are refused naming the file and key or
# the plugin (doc_mask.sh). The corpus is examples/data/tessera-docs.txt through a test
# tokenizer. Each runs in a few seconds. The fixture directory is spelled out: tests/plugins,
# which names it, is configured after this folder.
foreach(mode mesh errors)
  add_test(NAME e2e_doc_mask_${mode}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/doc_mask.sh ${TESSERA_BIN}
            ${PROJECT_SOURCE_DIR}/tests/data/tokenizer/bytelevel-llama3.json
            ${PROJECT_SOURCE_DIR}/examples/data/tessera-docs.txt ${E2E_OUT}/doc_mask_${mode} ${mode})
  set_tests_properties(e2e_doc_mask_${mode} PROPERTIES LABELS e2e TIMEOUT 600
    ENVIRONMENT TESSERA_PLUGIN_PATH=${PROJECT_BINARY_DIR}/tests/plugins/fixtures
    PASS_REGULAR_EXPRESSION "doc_mask ${mode}: (every bad job refused|14 meshes equal the 1-rank document-masked step, and on emu bit for bit)")
endforeach()

# The README's path from raw text to generate and export, run as written with 30 training steps
# (readme_path.sh), so that the README stays true. About ten seconds.
add_test(NAME e2e_readme_path
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/readme_path.sh ${PROJECT_SOURCE_DIR} ${TESSERA_BIN}
          ${E2E_OUT}/readme_path 30)
set_tests_properties(e2e_readme_path PROPERTIES LABELS e2e TIMEOUT 600
  PASS_REGULAR_EXPRESSION "readme path: 6 commands ran")
