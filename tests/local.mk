# tests/: unit (Check, no MPI), mpi (Check under mpirun via *.mpi files), cuda (skip 77 without
# GPU). One fragment per area, owned with the code it tests.
include tests/build.mk
include tests/base.mk
include tests/coll.mk
include tests/runtime.mk
include tests/fusion.mk
include tests/cnn.mk
include tests/gpt.mk
include tests/bench.mk
include tests/cuda.mk
include tests/dearbench.mk
include tests/python.mk
include tests/fuzz.mk
include tests/sanitizers.mk
