# docs/: PARAMS.md is generated from base/params.def by `dear-info --markdown`; never edit it
# by hand. `make params-doc` rewrites it in the source tree; tests/unit/params-doc.sh fails when
# the committed file differs from what the current build generates.
dist_doc_DATA += docs/PARAMS.md docs/PERFORMANCE.md docs/DESIGN.md docs/HACKING.md docs/USAGE.md docs/iteration.svg
EXTRA_DIST += docs/iteration-figure.sh

.PHONY: params-doc
params-doc: apps/tools/dear-info$(EXEEXT)
	$(AM_V_GEN)apps/tools/dear-info$(EXEEXT) --markdown > $(top_builddir)/PARAMS.md.tmp && \
	    mv -f $(top_builddir)/PARAMS.md.tmp $(top_srcdir)/docs/PARAMS.md
