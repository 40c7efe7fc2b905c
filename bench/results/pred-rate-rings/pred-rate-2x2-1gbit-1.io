lo_bytes link_bytes cpu_busy cpu_total
11686768 6.6747e+09 5831 15184
