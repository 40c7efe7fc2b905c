lo_bytes link_bytes cpu_busy cpu_total
6943 7.24704e+09 5897 15775
