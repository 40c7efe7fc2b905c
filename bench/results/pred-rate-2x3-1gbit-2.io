lo_bytes link_bytes cpu_busy cpu_total
2.64723e+10 6.6777e+09 8969 16350
