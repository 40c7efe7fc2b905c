# apps/gpt: dear-gpt, the character- or word-level transformer trainer. The model (model.c) and
# the text loader (text.c, words.c) build alone so that tests can link them without MPI or libdear.
bin_PROGRAMS += apps/gpt/dear-gpt
apps_gpt_dear_gpt_SOURCES = apps/gpt/train.c apps/gpt/model.c apps/gpt/model.h \
    apps/gpt/text.c apps/gpt/text.h apps/gpt/words.c
apps_gpt_dear_gpt_CFLAGS = $(AM_CFLAGS) $(CBLAS_CFLAGS)
apps_gpt_dear_gpt_LDADD = libdear.la $(CBLAS_LIBS) -lm
