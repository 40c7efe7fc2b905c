lo_bytes link_bytes cpu_busy cpu_total
6936 7.24649e+09 6190 15835
