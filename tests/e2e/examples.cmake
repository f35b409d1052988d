# Every job in examples/ runs two steps (and plans) without error, so the examples stay true.
file(GLOB EXAMPLE_JOBS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/examples/*.ini)
# llama-bpe trains on what `tessera tokenize` writes first: e2e_readme_path (doc_mask.cmake) runs
# it after that step, in a copy of the tree, as the README does
list(FILTER EXAMPLE_JOBS EXCLUDE REGEX "/llama-bpe\\.ini$")
foreach(job ${EXAMPLE_JOBS})
  get_filename_component(name ${job} NAME_WE)
  add_test(NAME e2e_example_${name}
    COMMAND sh -c "\"$0\" plan \"$1\" >/dev/null && \"$0\" run \"$1\" --no-peak --stop-at 2"
    ${TESSERA_BIN} ${job})
  set_tests_properties(e2e_example_${name} PROPERTIES LABELS e2e
    PASS_REGULAR_EXPRESSION "done: 2 steps")
endforeach()
