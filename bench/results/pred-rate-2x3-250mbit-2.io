lo_bytes link_bytes cpu_busy cpu_total
9.7679e+09 2.5004e+09 5419 20677
