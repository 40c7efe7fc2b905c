lo_bytes link_bytes cpu_busy cpu_total
31835497 6.6774e+09 7979 16060
