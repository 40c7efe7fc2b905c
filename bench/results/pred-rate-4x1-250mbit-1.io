lo_bytes link_bytes cpu_busy cpu_total
6935 3.06988e+09 5107 24034
