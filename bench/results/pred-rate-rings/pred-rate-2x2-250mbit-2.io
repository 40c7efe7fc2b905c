lo_bytes link_bytes cpu_busy cpu_total
8929528 2.49724e+09 3947 20224
