lo_bytes link_bytes cpu_busy cpu_total
26900165 2.5007e+09 6188 20781
