lo_bytes link_bytes cpu_busy cpu_total
30389469 6.6775e+09 8010 16156
