# tests for apps/gpt (dear-gpt).
# test_gpt_grad: every layer's backward and the whole model's gradient against central finite
#   differences, with model.c compiled in float64 (-DGPT_REAL_DOUBLE), no MPI.
# test_gpt_words: the word vocabulary against a reference counted another way (ranking, ties,
#   unknown words, spelling costs, a bad --vocab-size), and a word-level batch's input-embedding
#   gradient non-zero on exactly the rows of its distinct tokens, in float as the trainer runs.
# gpt-args.sh: bad arguments, an indivisible batch and a missing data file fail cleanly.
# gpt-equiv.sh: 2 ranks equal 1 rank with the same global batch, and the schedules dear, wfbp
#   and sync give the same loss curve, to float tolerance; --shard too, with 1/P of AdamW's
#   state per rank and, unclipped on 2 ranks, the unsharded parameters bit for bit.
# gpt-words.sh: the word-level model with its embedding sent sparse (DEAR_SPARSE on, auto) ends
#   with the parameters of dense runs, under every schedule on 2, 3 and 4 ranks, and really sent
#   sparse messages.
# gpt-lib.sh: what the gpt-*.sh tests share (sourced).
if HAVE_CHECK
check_PROGRAMS += tests/unit/test_gpt_grad
TESTS += tests/unit/test_gpt_grad
tests_unit_test_gpt_grad_SOURCES = tests/unit/test_gpt_grad.c apps/gpt/model.c apps/gpt/model.h \
    apps/gpt/text.c apps/gpt/text.h apps/gpt/words.c
tests_unit_test_gpt_grad_CFLAGS = $(AM_CFLAGS) $(CBLAS_CFLAGS) $(CHECK_CFLAGS) -DGPT_REAL_DOUBLE
tests_unit_test_gpt_grad_LDADD = $(CBLAS_LIBS) $(CHECK_LIBS) -lm
check_PROGRAMS += tests/unit/test_gpt_words
TESTS += tests/unit/test_gpt_words
tests_unit_test_gpt_words_SOURCES = tests/unit/test_gpt_words.c apps/gpt/model.c \
    apps/gpt/model.h apps/gpt/text.c apps/gpt/text.h apps/gpt/words.c
tests_unit_test_gpt_words_CFLAGS = $(AM_CFLAGS) $(CBLAS_CFLAGS) $(CHECK_CFLAGS)
tests_unit_test_gpt_words_LDADD = $(CBLAS_LIBS) $(CHECK_LIBS) -lm
endif
SH_TESTS += tests/apps/gpt-args.sh tests/apps/gpt-equiv.sh tests/apps/gpt-words.sh
EXTRA_DIST += tests/apps/gpt-lib.sh
