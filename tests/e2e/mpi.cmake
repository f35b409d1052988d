# End-to-end tests of `tessera run` under the mpi backend (included by tests/mpi/CMakeLists.txt,
# so only when the backend is built). Each case runs a job under `local`, then the same job as
# `mpirun -np N tessera run` with backend = mpi (N the mesh size), and compares the two dumps at
# rtol 1e-5.
#
# The jobs are the golden 'gqa' case with [mesh] and [plugins] replaced, written at configure time
# with absolute paths; a case is registered only when the plugins it loads are in the tree.

set(MPI_E2E_DIR ${CMAKE_CURRENT_BINARY_DIR}/e2e)
file(MAKE_DIRECTORY ${MPI_E2E_DIR})
set(MPI_E2E_GOLDEN ${PROJECT_SOURCE_DIR}/tests/data/golden/gqa)
set(MPI_E2E_BIN $<TARGET_FILE:tessera_cli>)
string(REPLACE ";" " " MPI_E2E_RUN "${TESSERA_MPIRUN}")
set(MPI_E2E_COMPARE ${PROJECT_SOURCE_DIR}/tests/mpi/compare_backends.sh)

# mpi_e2e_job(<name> <dims> <shape> <plugins>): ${MPI_E2E_DIR}/<name>.ini; ':'-separated lists.
function(mpi_e2e_job name dims shape plugins)
  string(REPLACE ":" ", " dims "${dims}")
  string(REPLACE ":" ", " shape "${shape}")
  string(REPLACE ":" ", " plugins "${plugins}")
  file(READ ${MPI_E2E_GOLDEN}/job.ini text)
  string(REPLACE "dims = dp, tp\nshape = 1, 1"
    "dims = ${dims}\nshape = ${shape}\n\n[plugins]\nload = ${plugins}" text "${text}")
  string(REPLACE "safetensors:batch.safetensors" "safetensors:${MPI_E2E_GOLDEN}/batch.safetensors"
    text "${text}")
  string(REPLACE "load = model.safetensors" "load = ${MPI_E2E_GOLDEN}/model.safetensors" text
    "${text}")
  file(WRITE ${MPI_E2E_DIR}/${name}.ini "${text}")
endfunction()

# name          dims         shape  plugins
set(MPI_E2E_CASES
  "dp2_tp2       dp:tp        2:2    dp:tp"
  "pp2_tp2       pp:tp        2:2    pp:tp"
  "ring_cp2_dp2  ring_cp:dp   2:2    cp_ring:dp"
  "dp2_tp2_pp2   dp:tp:pp     2:2:2  dp:tp:pp"
  "fsdp2_uly2    dp_shard:ulysses_cp 2:2 dp:cp_ulysses")
foreach(row ${MPI_E2E_CASES})
  string(REGEX REPLACE " +" ";" row "${row}")
  list(GET row 0 name)
  list(GET row 1 dims)
  list(GET row 2 shape)
  list(GET row 3 plugins)
  string(REPLACE ":" ";" needed "${plugins}")
  set(missing "")
  foreach(p ${needed})
    # This file is read before plugins/ is added, so a plugin counts as built when its folder is.
    if(NOT EXISTS ${PROJECT_SOURCE_DIR}/plugins/${p}/CMakeLists.txt)
      list(APPEND missing ${p})
    endif()
  endforeach()
  if(missing)
    message(STATUS "tessera: e2e_mpi_${name} not registered (plugins not built: ${missing})")
    continue()
  endif()
  mpi_e2e_job(${name} ${dims} ${shape} ${plugins})
  string(REPLACE ":" ";" sizes "${shape}")
  set(np 1)
  foreach(n ${sizes})
    math(EXPR np "${np} * ${n}")
  endforeach()
  add_test(NAME e2e_mpi_${name}
    COMMAND sh ${MPI_E2E_COMPARE} ${MPI_E2E_BIN} ${MPI_E2E_DIR}/${name}.ini ${MPI_E2E_DIR}/${name}
      ${np} ${TESSERA_MPIRUN})
  set_tests_properties(e2e_mpi_${name} PROPERTIES LABELS "mpi;e2e" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")
endforeach()

# The mirror example (4 ranks of replicated training) needs only the test plugin.
set(MPI_E2E_MIRROR ${PROJECT_SOURCE_DIR}/examples/mirror.ini)
add_test(NAME e2e_mpi_mirror4
  COMMAND sh ${MPI_E2E_COMPARE} ${MPI_E2E_BIN} ${MPI_E2E_MIRROR} ${MPI_E2E_DIR}/mirror4 4
    ${TESSERA_MPIRUN})
set_tests_properties(e2e_mpi_mirror4 PROPERTIES LABELS "mpi;e2e" TIMEOUT 300
  PASS_REGULAR_EXPRESSION "MATCH: 0 tensors")

# Faults (TESSERA_MPI_TEST_FAULT, test builds only): rank 1 killed at its 30th collective makes
# the job exit non-zero with mpirun naming it; rank 2 hanging there makes every other rank time
# out naming rank 2 and end the job with exit 1.
# The hung case's 10 s timeout is long enough that a loaded CI machine does not make healthy
# collectives time out first; the killed case's 60 s leaves the report to mpirun.
set(MPI_E2E_FLAGS "--no-peak --no-progress --set job.backend=mpi --set job.timeout_s=")
add_test(NAME e2e_mpi_killed_rank
  COMMAND sh -c "TESSERA_MPI_TEST_FAULT=kill:1:30 $0 -np 4 \"$1\" run \"$2\" ${MPI_E2E_FLAGS}60 2>&1; echo exit=$?"
    ${MPI_E2E_RUN} ${MPI_E2E_BIN} ${MPI_E2E_MIRROR})
set_tests_properties(e2e_mpi_killed_rank PROPERTIES LABELS "mpi;e2e" TIMEOUT 120
  PASS_REGULAR_EXPRESSION "process rank 1 .*signal 9.*exit=[1-9]")
add_test(NAME e2e_mpi_hung_rank
  COMMAND sh -c "TESSERA_MPI_TEST_FAULT=stall:2:30 $0 -np 4 \"$1\" run \"$2\" ${MPI_E2E_FLAGS}10 2>&1; echo exit=$?"
    ${MPI_E2E_RUN} ${MPI_E2E_BIN} ${MPI_E2E_MIRROR})
set_tests_properties(e2e_mpi_hung_rank PROPERTIES LABELS "mpi;e2e" TIMEOUT 120
  PASS_REGULAR_EXPRESSION "tessera run: rank 0: .*timed out after 10 s: rank 2 never arrived.*exit=1")

# Every rank reads the job; a validation error is printed once, by rank 0.
add_test(NAME e2e_mpi_validation_once
  COMMAND sh -c "$0 -np 4 \"$1\" run \"$2\" --set job.backend=mpi 2>&1 | grep -c 'no loaded plugin owns it'"
    ${MPI_E2E_RUN} ${MPI_E2E_BIN} ${PROJECT_SOURCE_DIR}/tests/plugins/jobs/unowned_dim.ini)
set_tests_properties(e2e_mpi_validation_once PROPERTIES LABELS "mpi;e2e" TIMEOUT 120
  PASS_REGULAR_EXPRESSION "^1\n$")

# A process count that is not the mesh's: every rank says how to start the job, exit 2.
add_test(NAME e2e_mpi_world_mismatch
  COMMAND sh -c "$0 -np 2 \"$1\" run \"$2\" ${MPI_E2E_FLAGS}60 2>&1; echo exit=$?"
    ${MPI_E2E_RUN} ${MPI_E2E_BIN} ${MPI_E2E_MIRROR})
set_tests_properties(e2e_mpi_world_mismatch PROPERTIES LABELS "mpi;e2e" TIMEOUT 120
  PASS_REGULAR_EXPRESSION "the mesh has 4 ranks but the job has 2 MPI processes.*exit=2")

# Sharded checkpoints across backends (docs/training.md): 4 mpi processes save each its own
# file; the checkpoint resumes on 1 local rank and under 4 processes on tp 4, and one of 8 local
# ranks under 4 processes (HSDP), each as the full-tensor export of the same save resumes.
add_test(NAME e2e_mpi_ckpt_sharded
  COMMAND sh ${PROJECT_SOURCE_DIR}/tests/e2e/ckpt_mpi.sh ${MPI_E2E_BIN}
    ${PROJECT_SOURCE_DIR}/tests/e2e/jobs/mesh_matrix.ini ${MPI_E2E_DIR}/ckpt_sharded ${TESSERA_MPIRUN})
set_tests_properties(e2e_mpi_ckpt_sharded PROPERTIES LABELS "mpi;e2e" TIMEOUT 300
  PASS_REGULAR_EXPRESSION "ckpt mpi: ok")

# [checkpoint] async under mpi: 4 processes save in the background the bytes they save in the
# foreground, and a resume from either ends the same.
add_test(NAME e2e_mpi_ckpt_async
  COMMAND sh ${PROJECT_SOURCE_DIR}/tests/e2e/ckpt_async.sh ${MPI_E2E_BIN}
    ${PROJECT_SOURCE_DIR}/tests/e2e/jobs/mesh_matrix.ini ${MPI_E2E_DIR}/ckpt_async ${TESSERA_MPIRUN})
set_tests_properties(e2e_mpi_ckpt_async PROPERTIES LABELS "mpi;e2e" TIMEOUT 300
  PASS_REGULAR_EXPRESSION "ckpt async: ok \\(mpi\\)")
