lo_bytes link_bytes cpu_busy cpu_total
26244941 2.5004e+09 6945 21093
