# apps/: sample trainers, the benchmark driver and the tools. Each owns a fragment.
include apps/tools/local.mk
include apps/cnn/local.mk
include apps/gpt/local.mk
include apps/bench/local.mk
