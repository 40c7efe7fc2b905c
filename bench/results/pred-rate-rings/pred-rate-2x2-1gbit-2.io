lo_bytes link_bytes cpu_busy cpu_total
11495680 6.6747e+09 6032 15290
