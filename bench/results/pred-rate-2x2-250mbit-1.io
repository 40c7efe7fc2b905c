lo_bytes link_bytes cpu_busy cpu_total
4.88019e+09 2.4976e+09 3561 20045
