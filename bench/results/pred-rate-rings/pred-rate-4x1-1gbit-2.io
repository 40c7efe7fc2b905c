lo_bytes link_bytes cpu_busy cpu_total
6943 7.24736e+09 5691 15592
