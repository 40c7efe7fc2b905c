lo_bytes link_bytes cpu_busy cpu_total
8848308 2.49729e+09 3936 20129
