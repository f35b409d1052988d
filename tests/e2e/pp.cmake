# Pipeline parallelism (plugins/pp): one step of pp2.ini (3 layers over 2 stages, uneven) and
# pp3.ini under each schedule and microbatch count equals the 1-rank run of pp_ref.ini (logits,
# loss, gradients, parameters after the step), and so do the interleaved jobs (virtual stages)
# and the explicit splits against pp_ref6.ini / pp_ref.ini, beside dp and tp too; 1F1B holds at
# most pp - stage microbatches per stage, GPipe all of them, zero_bubble at most pp; bad
# combinations are refused at plan time; tied embeddings over pp stages against the golden case.
add_test(NAME e2e_pp_reference
  COMMAND ${TESSERA_BIN} run ${E2E_JOBS}/pp_ref.ini --no-peak --dump ${E2E_OUT}/pp_ref.safetensors)
set_tests_properties(e2e_pp_reference PROPERTIES LABELS e2e FIXTURES_SETUP pp_ref)

add_test(NAME e2e_pp_reference6
  COMMAND ${TESSERA_BIN} run ${E2E_JOBS}/pp_ref6.ini --no-peak --dump ${E2E_OUT}/pp_ref6.safetensors)
set_tests_properties(e2e_pp_reference6 PROPERTIES LABELS e2e FIXTURES_SETUP pp_ref6)

foreach(job pp2 pp3)
  foreach(sched gpipe 1f1b zero_bubble)
    foreach(mb 1 2 3 4 8)
      add_test(NAME e2e_${job}_${sched}_mb${mb}
        COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/pp.sh ${TESSERA_BIN} ${E2E_JOBS}/${job}.ini
        ${E2E_OUT}/pp ${sched} ${mb} ${E2E_OUT}/pp_ref.safetensors)
      set_tests_properties(e2e_${job}_${sched}_mb${mb} PROPERTIES LABELS e2e
        FIXTURES_REQUIRED pp_ref PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
    endforeach()
  endforeach()
endforeach()

# Interleaved (2 chunks per rank: pp 2 with 2, 2, 1, 1 layers per stage; pp 3 one layer each,
# given by layers_per_stage; pp 2 x dp 2 x tp 2), explicit splits (1 + 2 layers) and pp x dp x tp
# under the other schedules; each job line: job, reference, schedule, microbatch counts.
foreach(c "pp2i;pp_ref6;interleaved_1f1b;2 4 8" "pp3i;pp_ref6;interleaved_1f1b;3 6"
          "pp2x2i;pp_ref6;interleaved_1f1b;2 4" "pp2_lps;pp_ref;1f1b;1 3"
          "pp2_lps;pp_ref;zero_bubble;2 8" "pp2x2;pp_ref;zero_bubble;1 4" "pp2x2;pp_ref;gpipe;2"
          "pp2_fsdp;pp_ref;zero_bubble;4")
  list(GET c 0 job)
  list(GET c 1 ref)
  list(GET c 2 sched)
  list(GET c 3 mbs)
  string(REPLACE " " ";" mbs "${mbs}")
  foreach(mb ${mbs})
    add_test(NAME e2e_${job}_${sched}_mb${mb}
      COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/pp.sh ${TESSERA_BIN} ${E2E_JOBS}/${job}.ini
      ${E2E_OUT}/pp ${sched} ${mb} ${E2E_OUT}/${ref}.safetensors)
    set_tests_properties(e2e_${job}_${sched}_mb${mb} PROPERTIES LABELS e2e
      FIXTURES_REQUIRED ${ref} PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
  endforeach()
endforeach()

# Peak microbatches whose activations a rank holds at once, measured while the step runs.
foreach(c "pp2;1f1b;8;2 1" "pp3;1f1b;8;3 2 1" "pp3;1f1b;2;2 2 1" "pp2;gpipe;4;4 4"
          "pp3;zero_bubble;8;3 3 3")
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

# The trace has a track per rank with every forward, backward and transfer of the schedule (and
# the ops and communication inside them, tests/e2e/trace.sh).
add_test(NAME e2e_pp_trace
  COMMAND sh -c "\"$0\" run \"$1\" --no-peak --stop-at 1 --set output.trace=\"$2\" >/dev/null && grep -c '\"cat\": \"pipeline\"' \"$2\" && grep -o 'rank 1 (stage 1)' \"$2\""
  ${TESSERA_BIN} ${E2E_JOBS}/pp2.ini ${E2E_OUT}/pp2_trace.json)
# 2 microbatches of 1F1B: rank 0 forward, send, backward, receive per microbatch (8), rank 1
# receive, forward, backward, send (8)
set_tests_properties(e2e_pp_trace PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "^16\nrank 1 \\(stage 1\\)")

# zero_bubble's trace has every input and weight part on its own slice.
add_test(NAME e2e_pp_trace_zero_bubble
  COMMAND sh -c "sed 's/^schedule = .*/schedule = zero_bubble/' \"$1\" > \"$2.ini\" && \"$0\" run \"$2.ini\" --no-peak --stop-at 1 --set output.trace=\"$2\" >/dev/null && grep -c '\"backward_input [0-9]' \"$2\" && grep -c '\"backward_weight [0-9]' \"$2\""
  ${TESSERA_BIN} ${E2E_JOBS}/pp2.ini ${E2E_OUT}/pp2_zb_trace.json)
# 2 microbatches on 2 ranks: 4 input parts, 4 weight parts
set_tests_properties(e2e_pp_trace_zero_bubble PROPERTIES LABELS e2e PASS_REGULAR_EXPRESSION "^4\n4\n$")

add_test(NAME e2e_pp_plan_timeline COMMAND ${TESSERA_BIN} plan ${E2E_JOBS}/pp2.ini)
set_tests_properties(e2e_pp_plan_timeline PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "stage 0 \\| F0 F1  \\.  \\. B0 B0  \\. B1 B1\n  stage 1 \\|  \\. F0 B0 B0 F1 B1 B1  \\.  \\.\n  bubble fraction 0\\.333")
add_test(NAME e2e_pp_plan_timeline_interleaved COMMAND ${TESSERA_BIN} plan ${E2E_JOBS}/pp2i.ini)
set_tests_properties(e2e_pp_plan_timeline_interleaved PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "rank 0 \\| F0a F1a F0b F1b   \\.   \\. B0b B0b   \\. B1b B1b B0a B0a B1a B1a\n  rank 1 \\|   \\. F0a F1a F0b B0b B0b F1b B1b B1b B0a B0a B1a B1a   \\.   \\.\n  bubble fraction 0\\.200")
add_test(NAME e2e_pp_plan_timeline_zero_bubble
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/pp_reject.sh ${TESSERA_BIN} ${E2E_JOBS}/pp3.ini
  ${E2E_OUT}/pp3_zb_plan.ini "schedule = zero_bubble|microbatches = 4")
set_tests_properties(e2e_pp_plan_timeline_zero_bubble PROPERTIES LABELS e2e
  PASS_REGULAR_EXPRESSION "stage 0 \\| F0 F1 F2  \\.  \\. I0 W0 F3 I1 W1 I2 W2 I3 W3\n  stage 1 \\|  \\. F0 F1  \\. I0 F2 I1 W0 F3 I2 W1 I3 W2 W3\n  stage 2 \\|  \\.  \\. F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3\n  bubble fraction 0\\.143.*exit=0")

# Refused at plan time, each with its reason: "lines to set;expected message".
foreach(c "schedule = interleaved_1f1b;\\[strategy\\.pp\\] stages_per_rank: interleaved_1f1b needs stages_per_rank >= 2 .model chunks per rank., got 1"
          "schedule = interleaved_1f1b|stages_per_rank = 2|microbatches = 3;\\[strategy\\.pp\\] microbatches: interleaved_1f1b needs microbatches % pp == 0, got 3 over pp = 2"
          "schedule = interleaved_1f1b|stages_per_rank = 2;\\[model\\] num_hidden_layers: 3 layers cannot fill 4 pipeline stages .pp = 2 x stages_per_rank = 2"
          "schedule = zero_bubble|stages_per_rank = 2;\\[strategy\\.pp\\] stages_per_rank: 2 model chunks per rank need schedule = interleaved_1f1b .zero_bubble runs one chunk per rank."
          "stages_per_rank = 2;\\[strategy\\.pp\\] stages_per_rank: 2 model chunks per rank need schedule = interleaved_1f1b .1f1b"
          "microbatches = 9;\\[strategy\\.pp\\] microbatches: 9 microbatches but a step has 8 rows"
          "layers_per_stage = 2, 2;\\[strategy\\.pp\\] layers_per_stage: layers_per_stage = 2, 2 sums to 4 but \\[model\\] num_hidden_layers = 3"
          "layers_per_stage = 3;\\[strategy\\.pp\\] layers_per_stage: layers_per_stage = 3 has 1 counts for 2 stages"
          "layers_per_stage = 3, 0;\\[strategy\\.pp\\] layers_per_stage: layers_per_stage = 3, 0 gives stage 1 0 layers")
  list(GET c 0 set)
  list(GET c 1 want)
  string(REGEX REPLACE "[^a-z0-9]+" "_" tag "${set}")
  add_test(NAME e2e_pp_rejects_${tag}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/pp_reject.sh ${TESSERA_BIN} ${E2E_JOBS}/pp2.ini
    ${E2E_OUT}/pp_bad_${tag}.ini "${set}")
  set_tests_properties(e2e_pp_rejects_${tag} PROPERTIES LABELS e2e
    PASS_REGULAR_EXPRESSION "${want}.*exit=2")
endforeach()

# Checkpoint save with pp > 1 gathers every stage (pp 2, pp 3, pp 2 x dp 2 x tp 2, interleaved)
# and a 1-rank load of it runs the same model; tied over pp 2 (2 steps), the embedding is written
# once and a load fills both of its copies.
foreach(c "pp2;pp_ref" "pp3;pp_ref" "pp2x2;pp_ref" "pp2i;pp_ref6" "pp2_tied;pp_ref_tied")
  list(GET c 0 job)
  list(GET c 1 ref)
  add_test(NAME e2e_${job}_checkpoint_save
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/pp_ckpt.sh ${TESSERA_BIN} ${E2E_JOBS}/${job}.ini
    ${E2E_JOBS}/${ref}.ini ${E2E_OUT}/pp_ckpt_${job})
  set_tests_properties(e2e_${job}_checkpoint_save PROPERTIES LABELS e2e
    PASS_REGULAR_EXPRESSION "MATCH: 0 tensors.*MATCH: 0 tensors.*MATCH: 0 tensors")
endforeach()

# Tied embeddings over pp stages (the first stage's embedding, a replica for the last stage's
# lm_head, gradients summed over the pair): the golden 'tied' case (PyTorch reference) under
# pp 2, pp 2 x tp 2 and pp 2 x dp 2, each schedule. Jobs written at configure time with absolute
# paths to the golden data; each line: name, dims, shape, plugins, microbatches.
set(PP_TIED_DIR ${CMAKE_CURRENT_BINARY_DIR}/pp_tied)
file(MAKE_DIRECTORY ${PP_TIED_DIR})
set(PP_TIED_GOLDEN ${PROJECT_SOURCE_DIR}/tests/data/golden/tied)
foreach(c "tied_pp2;pp, tp;2, 1;pp;2" "tied_pp2_tp2;pp, tp;2, 2;pp, tp;2"
          "tied_pp2_dp2;pp, dp;2, 2;pp, dp;1")
  list(GET c 0 name)
  list(GET c 1 dims)
  list(GET c 2 shape)
  list(GET c 3 plugins)
  list(GET c 4 mb)
  foreach(sched 1f1b gpipe zero_bubble)
    file(READ ${PP_TIED_GOLDEN}/job.ini text)
    string(REPLACE "dims = dp, tp\nshape = 1, 1"
      "dims = ${dims}\nshape = ${shape}\n\n[plugins]\nload = ${plugins}\n\n[strategy.pp]\nschedule = ${sched}\nmicrobatches = ${mb}"
      text "${text}")
    string(REPLACE "safetensors:batch.safetensors" "safetensors:${PP_TIED_GOLDEN}/batch.safetensors" text "${text}")
    string(REPLACE "load = model.safetensors" "load = ${PP_TIED_GOLDEN}/model.safetensors" text "${text}")
    string(REPLACE "dump = dump.safetensors" "dump = ${PP_TIED_DIR}/${name}_${sched}.safetensors" text "${text}")
    file(WRITE ${PP_TIED_DIR}/${name}_${sched}.ini "${text}")
    add_test(NAME e2e_pp_${name}_${sched}
      COMMAND sh -c "\"$0\" run \"$1\" --no-peak && \"$0\" compare \"$2\" \"$3\" --rtol 1e-4 --atol 1e-5"
      ${TESSERA_BIN} ${PP_TIED_DIR}/${name}_${sched}.ini ${PP_TIED_DIR}/${name}_${sched}.safetensors
      ${PP_TIED_GOLDEN}/expected.safetensors)
    set_tests_properties(e2e_pp_${name}_${sched} PROPERTIES LABELS e2e
      PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
  endforeach()
endforeach()
