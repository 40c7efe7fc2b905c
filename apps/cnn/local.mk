# apps/cnn: dear-cnn, the sample CNN trainer on Fashion-MNIST. It links libdear like
# any outside program would (pkg-config dear), plus CBLAS and zlib.
bin_PROGRAMS += apps/cnn/dear-cnn
apps_cnn_dear_cnn_SOURCES = apps/cnn/main.c apps/cnn/model.c apps/cnn/model.h \
    apps/cnn/data.c apps/cnn/data.h
apps_cnn_dear_cnn_CFLAGS = $(AM_CFLAGS) $(CBLAS_CFLAGS) $(ZLIB_CFLAGS)
apps_cnn_dear_cnn_LDADD = libdear.la $(CBLAS_LIBS) $(ZLIB_LIBS) -lm
