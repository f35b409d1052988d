# End-to-end tests of `tessera run` under the mpi backend (filled in below).
