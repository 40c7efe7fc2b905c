# tests for cnn
