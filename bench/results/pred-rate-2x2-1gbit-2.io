lo_bytes link_bytes cpu_busy cpu_total
1.32283e+10 6.6738e+09 5709 14869
