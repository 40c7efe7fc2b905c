# tests/coll.mk: the collectives (collectives/).
#   tests/mpi/coll-np{1..5}.mpi   test_coll: every algorithm x type x in/out of place x counts x
#                                 op against MPI_Allreduce, several in flight, multi-block
#                                 all-gather, bad arguments, 16-bit rounding, selection;
#                                 algo sparse over per-rank block patterns against direct
#                                 (bitwise) and MPI_Allreduce, with the form of every message.
#                                 np3 runs with 1 KiB ring segments (many segments per chunk);
#                                 np3 and np5 skip the 1000003-element cases (--quick). np4
#                                 also runs hier over synthetic 2 x 2 hosts (blocked and
#                                 interleaved ranks), then again with 1 KiB segments around
#                                 hier's segment size (one, several, tens of segments). Every
#                                 all-reduce but algo mpi's must leave the same bits on all ranks.
#   tests/mpi/coll-np6-3x2.mpi    hier alone over 3 x 2 synthetic hosts (rings across the hosts),
#   tests/mpi/coll-np6-2x3.mpi    and over 2 x 3 (shifted pairs); two tests so that each stays
#                                 well inside its time bound under MPICH, whose polling ranks
#                                 share 2 cores six ways. Interleaved hosts sweep float32 and
#                                 bfloat16 only (--quick).
#   tests/mpi/coll-np4-socket.mpi the np4 sweeps (--quick) again with the communicator and hier's
#                                 routed through the socket transport (collectives/sock.c),
#                                 which must have carried messages.
#   tests/mpi/compress-np{2,3,4,6}.mpi
#                                 test_compress: compressed float32 (bf16, fp16 on the wire), every
#                                 algorithm x op x in/out of place x counts against MPI_Allreduce in
#                                 float64: exact on integer data, within P + 2 roundings on random
#                                 data, the exact two-rank value (own input unrounded), half the
#                                 bytes, multi-block, other types untouched; np4 and np6 also over
#                                 every synthetic host layout (hier). int8: every algorithm asked
#                                 for runs direct (sparse stays float32), hier runs hier (float32
#                                 inside a host, int8 across), within half a block scale per
#                                 quantization of float64, ranks bitwise equal, the packed bytes,
#                                 error feedback over 30 iterations (one vector and multi-block,
#                                 flat and hier), refused under DEAR_DETERMINISTIC.
#   tests/mpi/compress-np3-socket.mpi  the same over the socket transport.
#   tests/mpi/net-np{2,3}.mpi     test_net: the socket transport alone: every pair and size,
#                                 receives early and late (unexpected messages), matching by
#                                 context and tag, truncation, abandon (before and part-way),
#                                 sub-communicators, an interface list that selects nothing, a
#                                 peer that leaves, and that ranks of one host use rings only
#                                 when asked (DEAR_SOCKET_SHM_BYTES).
#   tests/mpi/net-np3-rings.mpi   the same through 4 MiB shared-memory rings, and ring4k through
#                                 4 KiB ones (messages wrap, writers wait for room).
#   tests/mpi/netguard-np3.mpi    test_sock_guard: the socket transport against a hostile
#                                 network: spoofed and replayed hellos, a rank's claim from the
#                                 wrong address, a rank proving itself twice, silent strays
#                                 during set-up, a header announcing 8 GiB, a flood of
#                                 messages without receives, a ring's counters that lie.
#   tests/unit/test_q8            the int8 block codec against a float64 reference: scales, the
#                                 scale / 2 bound, zero and non-finite blocks, error feedback.
#   tests/unit/test_sock_auth     the HMAC-SHA256 wrapper (nettle) against RFC 4231, and
#                                 the handshake's records and proofs (replay, reflection).
#   make check-valgrind-coll      one np=2 run under valgrind memcheck, zero errors required
#                                 (Open MPI internals suppressed by tests/valgrind-ompi.supp).
CK_PROGS += tests/mpi/test_coll tests/mpi/test_compress tests/mpi/test_net tests/mpi/test_sock_guard
CK_TESTS += tests/unit/test_sock_auth tests/unit/test_q8
CK_RUNS += tests/mpi/coll-np1.mpi tests/mpi/coll-np2.mpi tests/mpi/coll-np3.mpi \
    tests/mpi/coll-np4.mpi tests/mpi/coll-np5.mpi \
    tests/mpi/coll-np6-3x2.mpi tests/mpi/coll-np6-2x3.mpi tests/mpi/coll-np4-socket.mpi \
    tests/mpi/net-np2.mpi tests/mpi/net-np3.mpi tests/mpi/net-np3-rings.mpi tests/mpi/net-np3-ring4k.mpi \
    tests/mpi/netguard-np3.mpi \
    tests/mpi/compress-np2.mpi tests/mpi/compress-np3.mpi tests/mpi/compress-np4.mpi tests/mpi/compress-np6.mpi \
    tests/mpi/compress-np3-socket.mpi
EXTRA_DIST += tests/valgrind-ompi.supp
# test_coll, test_compress and test_sock_auth need only the collectives and base; the sweeps'
# checks wait for their blocking collectives without spinning (TEST_MPI_LIBS).
tests_mpi_test_coll_LDADD = $(DEAR_COLL_LIBS) $(TEST_MPI_LIBS) $(CHECK_LIBS) $(DEAR_DEP_LIBS)
tests_mpi_test_compress_LDADD = $(tests_mpi_test_coll_LDADD)
tests_unit_test_sock_auth_LDADD = $(tests_mpi_test_coll_LDADD)
tests_unit_test_q8_LDADD = $(tests_mpi_test_coll_LDADD) -lm

VALGRIND_COLL = valgrind --tool=memcheck --error-exitcode=1 --leak-check=no \
    --suppressions=$(abs_top_srcdir)/tests/valgrind-ompi.supp --quiet
check-valgrind-coll: tests/mpi/test_coll$(EXEEXT)
	@test "$(MPI_FLAVOUR)" = openmpi || \
	    { echo "check-valgrind-coll: the suppressions cover Open MPI only, not $(MPI_FLAVOUR)"; exit 1; }
	$(MPI_LAUNCH_ENV) . $(top_srcdir)/tests/mpi-launch.sh && mpi_run 900 2 CK_FORK=no \
	    $(VALGRIND_COLL) $(abs_top_builddir)/tests/mpi/test_coll --quick
.PHONY: check-valgrind-coll
