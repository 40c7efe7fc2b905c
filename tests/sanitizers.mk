# tests/sanitizers.mk: the whole suite under a sanitizer, in a copy of the distribution built
# in build-asan/ or build-tsan/ (tests/sanitizers/check-sanitized.sh); not part of make check.
#   make check-asan   ASan + LeakSanitizer + UBSan, any report fails
#   make check-tsan   ThreadSanitizer, any report fails
#   SAN_TESTS="..."   run these tests only (as TESTS=)
# Open MPI's own noise: tests/sanitizers/lsan.supp (its leaks); TSan ignores what uninstrumented
# libraries do (tests/sanitizers/check-sanitized.sh says why).
SAN_FILES = tests/sanitizers/check-sanitized.sh tests/sanitizers/lsan.supp
EXTRA_DIST += $(SAN_FILES)
check-asan check-tsan: $(SAN_FILES)
	top_srcdir='$(top_srcdir)' top_builddir='$(top_builddir)' MAKE='$(MAKE)' \
	    $(SHELL) $(top_srcdir)/tests/sanitizers/check-sanitized.sh $(@:check-%=%)
.PHONY: check-asan check-tsan
clean-local: clean-local-sanitizers
clean-local-sanitizers:
	-rm -rf $(top_builddir)/build-asan $(top_builddir)/build-tsan
.PHONY: clean-local-sanitizers
