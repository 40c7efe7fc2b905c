lo_bytes link_bytes cpu_busy cpu_total
6943 3.07013e+09 4136 24152
