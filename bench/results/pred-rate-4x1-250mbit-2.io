lo_bytes link_bytes cpu_busy cpu_total
7047 3.06998e+09 4112 24035
