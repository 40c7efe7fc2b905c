lo_bytes link_bytes cpu_busy cpu_total
4.88001e+09 2.49744e+09 3619 20109
