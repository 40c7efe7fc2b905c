lo_bytes link_bytes cpu_busy cpu_total
9.76709e+09 2.5003e+09 5526 20646
