# Checks of cp_allgather against the installed `tessera` (TESSERA_EXECUTABLE from the package).
#
# Each case runs cp_allgather.ini for one step with a mesh override and compares its dump with
# the 1-rank run of the same job at rtol = atol = 1e-4, the tolerance Tessera's own mesh tests use
# against the 1-rank run; `tessera compare` prints "MATCH: 0 tensors" when every tensor agrees.
# (Parameters after the first AdamW step move by about lr * sign(g), so an element whose gradient
# is below AdamW's eps, ~5e-9 here, turns float noise in g into ~1e-5 in the parameter: cp_ring
# shows the same on ring_cp 4.)
#
# With -DTESSERA_GOLDEN_DIR=<dir holding job.ini and expected.safetensors> (Tessera's
# tests/data/golden/gqa), runs of that case are also compared with the PyTorch reference's dump,
# at the tolerance of Tessera's own golden tests (rtol 1e-4, atol 1e-5).
#
# Each mesh case has an `_emu` twin: the same job on `job.device=emu` against `job.device=cpu`, bit
# for bit (rtol = atol = 0). The emulated device keeps tensor memory behind pointers the host
# cannot dereference and runs the CPU's kernels behind them, so a host read or write of tensor
# memory crashes the run and any other slip off the device's kernel table shows as a difference:
# the check, without a GPU, that the plugin runs on any device.
set(AG_JOB ${CMAKE_CURRENT_SOURCE_DIR}/cp_allgather.ini)
set(AG_OUT ${CMAKE_CURRENT_BINARY_DIR}/checks)
file(MAKE_DIRECTORY ${AG_OUT})
# The plugin comes from this build folder whatever the job's [plugins] path says.
set(AG_ENV "TESSERA_PLUGIN_PATH=$<TARGET_FILE_DIR:tessera-cp_allgather>")
set(AG_RUN ${TESSERA_EXECUTABLE} run ${AG_JOB} --no-peak --no-progress --set job.steps=1)

add_test(NAME cp_allgather_reference
  COMMAND ${AG_RUN} --set mesh.shape=1,1 --dump ${AG_OUT}/reference.safetensors)
set_tests_properties(cp_allgather_reference PROPERTIES
  ENVIRONMENT "${AG_ENV}" FIXTURES_SETUP ag_reference)

# ag_emu_case(<name> <job> <--set overrides>...): the job on emu equals the job on cpu, bit for bit.
function(ag_emu_case name job)
  set(cpu ${AG_OUT}/${name}.cpu.safetensors)
  set(emu ${AG_OUT}/${name}.emu.safetensors)
  add_test(NAME cp_allgather_${name}_emu
    COMMAND sh -c "\"$@\" --set job.device=cpu --dump \"${cpu}\" && \"$@\" --set job.device=emu --dump \"${emu}\" && \"$0\" compare \"${emu}\" \"${cpu}\" --rtol 0 --atol 0"
      ${TESSERA_EXECUTABLE} ${TESSERA_EXECUTABLE} run ${job} --no-peak --no-progress
      --set job.steps=1 ${ARGN})
  set_tests_properties(cp_allgather_${name}_emu PROPERTIES ENVIRONMENT "${AG_ENV}"
    PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
endfunction()

# ag_case(<name> <--set overrides>...): run with the overrides, compare with the reference; and
# its emu twin.
function(ag_case name)
  add_test(NAME cp_allgather_${name}
    COMMAND sh -c "\"$@\" && \"$0\" compare \"${AG_OUT}/${name}.safetensors\" \"${AG_OUT}/reference.safetensors\" --rtol 1e-4 --atol 1e-4"
      ${TESSERA_EXECUTABLE} ${AG_RUN} ${ARGN} --dump ${AG_OUT}/${name}.safetensors)
  set_tests_properties(cp_allgather_${name} PROPERTIES ENVIRONMENT "${AG_ENV}"
    FIXTURES_REQUIRED ag_reference PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
  ag_emu_case(${name} ${AG_JOB} ${ARGN})
endfunction()

ag_case(ag_cp4)                                                        # the job as written
ag_case(ag_cp3_uneven --set mesh.shape=1,3)                            # 32 rows: 11, 11, 10
ag_case(dp2_ag_cp2 --set mesh.shape=2,2 --set plugins.load=dp,cp_allgather)
ag_case(tp2_ag_cp2 --set mesh.dims=tp,ag_cp --set mesh.shape=2,2 --set plugins.load=tp,cp_allgather)
# Pipeline stages: the hidden states cross stage boundaries split along the sequence on ag_cp,
# as the data split declares.
ag_case(pp2_ag_cp2 --set mesh.dims=pp,ag_cp --set mesh.shape=2,2 --set plugins.load=pp,cp_allgather)
# Ulysses inside, all-gather across: cp_ulysses hands attention to this plugin's rule.
ag_case(ag_cp2_ulysses_cp2 --set mesh.dims=ag_cp,ulysses_cp --set mesh.shape=2,2
        --set plugins.load=cp_allgather,cp_ulysses)
# cp_ring loads beside it, each plugin on its own dim; on this mesh ring_cp is absent and cp_ring
# stays inactive.
ag_case(ag_cp4_beside_cp_ring --set plugins.load=cp_allgather,cp_ring)

# The plugin's own key, set from the command line like the core's.
ag_case(ag_cp4_regather --set strategy.cp_allgather.regather_backward=true)

# With both dims split, attention has two communicating rules, cp_ring's on ring_cp and this
# plugin's on ag_cp, and neither hands the op to the other (cp_ulysses's does): the core refuses
# the step, naming both rules and their dims, and the run fails (exit 1).
add_test(NAME cp_allgather_ring_cp2_ag_cp2_refused
  COMMAND sh -c "\"$@\" 2>&1; echo exit=$?" ${TESSERA_EXECUTABLE} ${AG_RUN}
    --set mesh.dims=ring_cp,ag_cp --set mesh.shape=2,2 --set plugins.load=cp_allgather,cp_ring)
set_tests_properties(cp_allgather_ring_cp2_ag_cp2_refused PROPERTIES ENVIRONMENT "${AG_ENV}"
  PASS_REGULAR_EXPRESSION "'cp_ring.sdpa' \\(mesh dim 'ring_cp'\\) and 'cp_allgather.sdpa' \\(mesh dim 'ag_cp'\\) both communicate.*exit=1")

# A sequence shorter than the sequence shards of every dim that splits it (here ag_cp alone) is
# refused by the plugin's check_registry before any rank starts (exit 2).
add_test(NAME cp_allgather_short_sequence_refused
  COMMAND sh -c "\"$@\" 2>&1; echo exit=$?" ${TESSERA_EXECUTABLE} ${AG_RUN} --set data.seq_len=3)
set_tests_properties(cp_allgather_short_sequence_refused PROPERTIES ENVIRONMENT "${AG_ENV}"
  PASS_REGULAR_EXPRESSION "seq_len: 3 tokens cannot give every one of the 4 sequence shards \\(ag_cp = 4\\).*exit=2")

# name, [mesh] dims, shape, [plugins] load of the golden cases (8 heads, 4 kv heads, seq 16).
set(AG_GOLDEN_CASES
  "ag_cp4            ag_cp               4     cp_allgather"
  "ag_cp3_uneven     ag_cp               3     cp_allgather"
  "ag_cp2_ulysses2   ag_cp,ulysses_cp    2,2   cp_allgather,cp_ulysses"
  "tp2_ag_cp2        tp,ag_cp            2,2   tp,cp_allgather"
  "pp2_ag_cp2        pp,ag_cp            2,2   pp,cp_allgather")
if(TESSERA_GOLDEN_DIR)
  foreach(row ${AG_GOLDEN_CASES})
    string(REGEX REPLACE " +" ";" row "${row}")
    list(GET row 0 name)
    list(GET row 1 dims)
    list(GET row 2 shape)
    list(GET row 3 load)
    add_test(NAME cp_allgather_golden_${name}
      COMMAND sh -c "\"$@\" && \"$0\" compare \"${AG_OUT}/golden_${name}.safetensors\" \"${TESSERA_GOLDEN_DIR}/expected.safetensors\" --rtol 1e-4 --atol 1e-5"
        ${TESSERA_EXECUTABLE} ${TESSERA_EXECUTABLE} run ${TESSERA_GOLDEN_DIR}/job.ini --no-peak
        --no-progress --set mesh.dims=${dims} --set mesh.shape=${shape} --set plugins.load=${load}
        --dump ${AG_OUT}/golden_${name}.safetensors)
    set_tests_properties(cp_allgather_golden_${name} PROPERTIES ENVIRONMENT "${AG_ENV}"
      PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
  endforeach()
endif()
