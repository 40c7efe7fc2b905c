lo_bytes link_bytes cpu_busy cpu_total
6943 3.06984e+09 4283 24043
