lo_bytes link_bytes cpu_busy cpu_total
1.32277e+10 6.674e+09 5527 14835
