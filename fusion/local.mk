# fusion/: plans, cost model, simulator, planners. Pure C: no MPI or CUDA calls.
noinst_LTLIBRARIES += fusion/libdearfusion.la
fusion_libdearfusion_la_SOURCES = fusion/plan.h fusion/plan.c
fusion_libdearfusion_la_CFLAGS = $(AM_CFLAGS) $(VIS_CFLAGS)
