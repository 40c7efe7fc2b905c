# apps/cnn
