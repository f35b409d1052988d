# Pipeline parallelism (plugins/pp): one step of pp2.ini (3 layers over 2 stages, uneven) and
# pp3.ini under each schedule and microbatch count equals the 1-rank run of pp_ref.ini (logits,
# loss, gradients, parameters after the step); 1F1B holds at most pp - stage microbatches per
# stage, GPipe all of them; bad combinations are refused at plan time.
add_test(NAME e2e_pp_reference
  COMMAND ${TESSERA_BIN} run ${E2E_JOBS}/pp_ref.ini --no-peak --dump ${E2E_OUT}/pp_ref.safetensors)
set_tests_properties(e2e_pp_reference PROPERTIES LABELS e2e FIXTURES_SETUP pp_ref)

foreach(job pp2 pp3)
  foreach(sched gpipe 1f1b)
    foreach(mb 1 2 3 4 8)
      add_test(NAME e2e_${job}_${sched}_mb${mb}
        COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/pp.sh ${TESSERA_BIN} ${E2E_JOBS}/${job}.ini
        ${E2E_OUT}/pp ${sched} ${mb} ${E2E_OUT}/pp_ref.safetensors)
      set_tests_properties(e2e_${job}_${sched}_mb${mb} PROPERTIES LABELS e2e
        FIXTURES_REQUIRED pp_ref PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
    endforeach()
  endforeach()
endforeach()

# Peak microbatches whose activations a rank holds at once, measured while the step runs.
foreach(c "pp2;1f1b;8;2 1" "pp3;1f1b;8;3 2 1" "pp3;1f1b;2;2 2 1" "pp2;gpipe;4;4 4")
  list(GET c 0 job)
  list(GET c 1 sched)
  list(GET c 2 mb)
  list(GET c 3 want)
  string(REPLACE " " "_" tag "${want}")
  add_test(NAME e2e_${job}_${sched}_mb${mb}_in_flight
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/pp.sh ${TESSERA_BIN} ${E2E_JOBS}/${job}.ini
    ${E2E_OUT}/pp_flight ${sched} ${mb} ${E2E_OUT}/pp_ref.safetensors)
  set_tests_properties(e2e_${job}_${sched}_mb${mb}_in_flight PROPERTIES LABELS e2e
    FIXTURES_REQUIRED pp_ref
    PASS_REGULAR_EXPRESSION "in flight per rank: ${want}\n.*MATCH: 0 tensors")
endforeach()

# The trace has a track per rank with every forward, backward and transfer.
add_test(NAME e2e_pp_trace
  COMMAND sh -c "\"$0\" run \"$1\" --no-peak --stop-at 1 --set output.trace=\"$2\" >/dev/null && grep -c '\"ph\": \"X\"' \"$2\" && grep -o 'rank 1 (stage 1)' \"$2\""
  ${TESSERA_BIN} ${E2E_JOBS}/pp2.ini ${E2E_OUT}/pp2_trace.json)
# 2 microbatches of 1F1B: rank 0 forward, send, backward, receive per microbatch (8), rank 1
# receive, forward, backward, send (8)
set_tests_properties(e2e_pp_trace PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "^16\nrank 1 \\(stage 1\\)")

add_test(NAME e2e_pp_plan_timeline COMMAND ${TESSERA_BIN} plan ${E2E_JOBS}/pp2.ini)
set_tests_properties(e2e_pp_plan_timeline PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "stage 0 \\| F0 F1  \\.  \\. B0 B0  \\. B1 B1\n  stage 1 \\|  \\. F0 B0 B0 F1 B1 B1  \\.  \\.\n  bubble fraction 0\\.333")

foreach(c "schedule = interleaved_1f1b;schedule: interleaved_1f1b .virtual stages. is not implemented"
          "schedule = zero_bubble;schedule: zero_bubble .* is not implemented"
          "microbatches = 9;microbatches: 9 microbatches but a step has 8 rows"
          "stages_per_rank = 2;stages_per_rank: 2 model chunks per rank"
          "layers_per_stage = 2, 1;layers_per_stage: an explicit layer split is not implemented")
  list(GET c 0 set)
  list(GET c 1 want)
  string(REGEX REPLACE "[^a-z0-9]+" "_" tag "${set}")
  string(REGEX REPLACE " = .*" "" key "${set}")
  add_test(NAME e2e_pp_rejects_${tag}
    COMMAND sh -c "sed -e '/^${key} = /d' -e 's/^\\[strategy.pp\\]/[strategy.pp]\\n${set}/' \"$1\" > \"$2\" && \"$0\" plan \"$2\" 2>&1; echo exit=$?"
    ${TESSERA_BIN} ${E2E_JOBS}/pp2.ini ${E2E_OUT}/pp_bad_${tag}.ini)
  set_tests_properties(e2e_pp_rejects_${tag} PROPERTIES LABELS e2e
    PASS_REGULAR_EXPRESSION "\\[strategy\\.pp\\] ${want}.*exit=2")
endforeach()
