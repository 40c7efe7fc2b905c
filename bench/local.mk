# bench/: emulated cluster and measurement scripts
