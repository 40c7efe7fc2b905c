# tests for apps/cnn. Unit tests link the model alone (built in double for the
# finite-difference checks); the *.sh tests run dear-cnn under mpirun on a few hundred images.
if HAVE_CHECK
check_PROGRAMS += tests/unit/test_cnn_model tests/unit/test_cnn_data
TESTS += tests/unit/test_cnn_model tests/unit/test_cnn_data
tests_unit_test_cnn_model_SOURCES = tests/unit/test_cnn_model.c apps/cnn/model.c apps/cnn/model.h
tests_unit_test_cnn_model_CPPFLAGS = $(AM_CPPFLAGS) -DCNN_DOUBLE
tests_unit_test_cnn_model_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(CBLAS_CFLAGS)
tests_unit_test_cnn_model_LDADD = $(CHECK_LIBS) $(CBLAS_LIBS) -lm
tests_unit_test_cnn_data_SOURCES = tests/unit/test_cnn_data.c apps/cnn/data.c apps/cnn/data.h
tests_unit_test_cnn_data_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(ZLIB_CFLAGS)
tests_unit_test_cnn_data_LDADD = $(CHECK_LIBS) $(ZLIB_LIBS)
endif
SH_TESTS += tests/apps/cnn-errors.sh tests/apps/cnn-equiv.sh tests/apps/cnn-resume.sh tests/apps/cnn-files.sh
EXTRA_DIST += tests/apps/cnn-lib.sh
