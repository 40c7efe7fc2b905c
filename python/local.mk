# python/: the PyTorch binding, a ctypes package over libdear (python/dear/__init__.py says why
# ctypes). It installs where Debian's python3 looks for site packages under the prefix
# (/usr/local/lib/python3/dist-packages by default) and finds $(libdir)/libdear.so.1 from there.
dearpydir = $(libdir)/python3/dist-packages/dear
dist_dearpy_DATA = python/dear/__init__.py
