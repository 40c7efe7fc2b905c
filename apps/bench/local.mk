# apps/bench
