lo_bytes link_bytes cpu_busy cpu_total
2.64716e+10 6.6777e+09 9539 16411
