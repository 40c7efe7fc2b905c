lo_bytes link_bytes cpu_busy cpu_total
6995 7.24691e+09 6241 15520
